"""docker-compose.yml cannot run here (no Docker engine); check what can be checked statically."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from stepwise_cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_defines_every_service_of_the_deployment(compose):
    assert {"redis", "minio", "minio-init", "api", "worker", "flower"} <= set(compose["services"])


def test_redis_keeps_its_data_with_the_append_only_file(compose):
    redis = compose["services"]["redis"]
    assert "--appendonly" in redis["command"] and "yes" in redis["command"]
    assert any(volume.endswith(":/data") for volume in redis["volumes"])


def test_the_worker_reserves_a_gpu_in_the_compose_deploy_form(compose):
    devices = compose["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_api_and_worker_share_redis_and_s3_settings(compose):
    for name in ("api", "worker"):
        env = compose["services"][name]["environment"]
        assert env["STEPWISE_REDIS_URL"] == "redis://redis:6379/0"
        assert env["STEPWISE_STORAGE_URL"].startswith("s3://")
        assert env["STEPWISE_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert "8000:8000" in compose["services"]["api"]["ports"]


def test_the_bucket_is_created_before_api_and_worker_start(compose):
    assert "mc mb" in compose["services"]["minio-init"]["command"][0]
    for name in ("api", "worker"):
        condition = compose["services"][name]["depends_on"]["minio-init"]["condition"]
        assert condition == "service_completed_successfully"


@pytest.mark.parametrize("service", ["api", "worker"])
def test_each_image_entry_command_exists_in_the_project(compose, service):
    command = compose["services"][service]["command"]
    assert command[0] == "stepwise" and command[1] in COMMANDS
    dockerfile = ROOT / compose["services"][service]["build"]["dockerfile"]
    cmd_line = next(line for line in dockerfile.read_text().splitlines() if line.startswith("CMD"))
    assert re.search(rf'"stepwise", "{command[1]}"', cmd_line)


def test_the_api_image_does_not_install_torch(compose):
    dockerfile = ROOT / compose["services"]["api"]["build"]["dockerfile"]
    text = dockerfile.read_text()
    assert "torch" not in text.replace("no torch", "") and "[engine]" not in text


def test_every_variable_compose_reads_is_in_env_example(compose):
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", (ROOT / "docker-compose.yml").read_text()))
    example = (ROOT / ".env.example").read_text()
    documented = set(re.findall(r"^#?\s*([A-Z0-9_]+)=", example, flags=re.M))
    assert used <= documented, f"missing from .env.example: {sorted(used - documented)}"


def test_the_worker_gets_longer_to_stop_than_its_shutdown_grace(compose):
    from worker.settings import WorkerSettings

    worker = compose["services"]["worker"]
    grace = float(worker["environment"].get("STEPWISE_SHUTDOWN_GRACE", WorkerSettings.shutdown_grace))
    match = re.fullmatch(r"(\d+)s", worker["stop_grace_period"])

    assert match and int(match.group(1)) > grace + 10  # time to re-queue what outlived the grace


def test_the_two_workers_serve_two_models_with_the_same_settings_otherwise(compose):
    first, second = compose["services"]["worker"], compose["services"]["worker-2"]
    assert first["environment"]["STEPWISE_MODEL"] != second["environment"]["STEPWISE_MODEL"]
    assert first["command"] == second["command"] and first["stop_grace_period"] == second["stop_grace_period"]
    assert second["environment"]["STEPWISE_REDIS_URL"] == first["environment"]["STEPWISE_REDIS_URL"]
