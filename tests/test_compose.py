"""docker-compose.yml cannot run here (no Docker engine); check what can be checked statically, the
file itself against the compose specification."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from settings import SECTIONS, VARIABLES, SettingsError, default
from stepwise_cli.main import COMMANDS
from tests.support.compose import ComposeRefusal, interpolate, read_env_file, required_variables
from tests.support.compose import load as load_compose
from tests.support.servers import child_env

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_defines_every_service_of_the_deployment(compose):
    assert {"redis", "s3", "api", "worker", "flower"} <= set(compose["services"])


def test_the_file_is_valid_against_the_compose_specification():
    checker = Path(sys.executable).with_name("check-jsonschema")
    result = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(ROOT / "docker-compose.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_image_is_pinned_to_a_version(compose):
    for name, service in compose["services"].items():
        if "image" in service:
            _, _, tag = service["image"].rpartition(":")
            assert re.fullmatch(r"\d+(\.\d+)+", tag), f"{name}: {service['image']} is not pinned"


def test_the_s3_server_is_seaweedfs_with_its_bucket_and_no_telemetry(compose):
    s3 = compose["services"]["s3"]
    assert s3["image"].startswith("chrislusf/seaweedfs:") and s3["command"][0] == "mini"
    assert "-bucket=${STEPWISE_S3_BUCKET:-stepwise}" in s3["command"]
    assert "-master.telemetry=false" in s3["command"] and s3["ports"] == ["${STEPWISE_S3_BIND:-127.0.0.1}:9000:9000"]
    assert (
        s3["environment"]["AWS_SECRET_ACCESS_KEY"] == compose["services"]["api"]["environment"]["AWS_SECRET_ACCESS_KEY"]
    )


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
        assert env["STEPWISE_S3_ENDPOINT_URL"] == "http://s3:9000"
    assert "8000:8000" in compose["services"]["api"]["ports"]


def test_the_bucket_exists_before_api_and_worker_start(compose):
    assert compose["services"]["s3"]["healthcheck"]["test"]  # healthy: serving S3, bucket created
    for name in ("api", "worker"):
        assert compose["services"][name]["depends_on"]["s3"]["condition"] == "service_healthy"


def test_the_api_serves_both_workers_models_by_configuration(compose):
    models = compose["services"]["api"]["environment"]["STEPWISE_MODELS"]
    assert "${STEPWISE_MODEL:-builtin:tiny}" in models and "${STEPWISE_MODEL_2:-builtin:small}" in models


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


@pytest.mark.parametrize("service", ["worker", "worker-2"])
def test_a_gpu_worker_gets_longer_to_stop_than_its_shutdown_grace_and_its_drain(compose, service):
    worker = compose["services"][service]
    stops = [float(default(name) or 0) for name in ("STEPWISE_SHUTDOWN_GRACE", "STEPWISE_DRAIN_SECONDS")]
    assert not {"STEPWISE_SHUTDOWN_GRACE", "STEPWISE_DRAIN_SECONDS"} & set(worker["environment"])  # .env's, if any
    match = re.fullmatch(r"(\d+)s", worker["stop_grace_period"])

    assert match and int(match.group(1)) > max(stops) + 10  # time to re-queue what outlived the grace


@pytest.mark.parametrize("service", ["api", "worker", "flower"])
def test_api_worker_and_flower_have_healthchecks(compose, service):
    healthcheck = compose["services"][service]["healthcheck"]
    assert healthcheck["test"][0] in ("CMD", "CMD-SHELL") and healthcheck["interval"]


def test_the_api_healthcheck_asks_readiness_and_the_worker_answers_a_celery_ping(compose):
    assert "/readyz" in " ".join(compose["services"]["api"]["healthcheck"]["test"])
    assert "inspect ping" in " ".join(compose["services"]["worker"]["healthcheck"]["test"])


def test_flower_is_reachable_from_this_host_only(compose):
    published = {name: service.get("ports", []) for name, service in compose["services"].items()}
    for port in ("5555",):
        bindings = [p for ports in published.values() for p in ports if p.split(":")[-1] == port]
        assert bindings and all(binding.startswith("127.0.0.1:") for binding in bindings), bindings
    assert "FLOWER_BASIC_AUTH" in compose["services"]["flower"]["environment"]


def test_presigned_urls_name_the_public_s3_endpoint_not_the_compose_host_name(compose, monkeypatch):
    from storage.image_store import open_image_store
    from storage.settings import StorageSettings

    env = compose["services"]["api"]["environment"]
    assert env["STEPWISE_S3_PUBLIC_URL"].startswith("${STEPWISE_S3_PUBLIC_URL:-http://localhost:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "stepwise")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3-test-secret")
    settings = StorageSettings(
        storage_url="s3://stepwise/images",
        s3_endpoint_url=env["STEPWISE_S3_ENDPOINT_URL"],
        s3_public_endpoint_url="http://localhost:9000",
    )
    store = open_image_store(settings)  # presigning sends no request: nothing is contacted

    url = store.presigned_url("jobs/j1/0.png")

    assert url.startswith("http://localhost:9000/stepwise/jobs/j1/0.png?")
    store.close()


def test_the_worker_keeps_built_in_models_on_a_volume(compose):
    worker = compose["services"]["worker"]
    cache_dir = worker["environment"]["STEPWISE_CACHE_DIR"]
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in worker["volumes"]}
    mount_point = next(point for point in mounts if cache_dir.startswith(point))
    assert mounts[mount_point] in compose["volumes"]


@pytest.mark.parametrize("service", ["api", "worker"])
def test_the_images_run_as_an_unprivileged_user(compose, service):
    lines = (ROOT / compose["services"][service]["build"]["dockerfile"]).read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    last_run = max(index for index, line in enumerate(lines) if line.startswith("RUN "))
    last_user = max(index for index, line in enumerate(lines) if line.startswith("USER "))
    assert users and users[-1] not in ("root", "0") and last_user > last_run


def test_the_worker_image_pins_the_same_torch_as_make_run():
    makefile_pin = re.search(r"^TORCH_VERSION := (\S+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    dockerfile = (ROOT / "docker" / "worker.Dockerfile").read_text()
    assert f"ARG TORCH_VERSION={makefile_pin}" in dockerfile
    assert '"torch==${TORCH_VERSION}"' in dockerfile


def _make_dry_run(target: str, tmp_path: Path) -> str:
    """The commands `make TARGET` would run for a venv that does not exist yet (`make -n`: nothing runs)."""
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_make_run_installs_only_what_running_needs_and_make_test_adds_the_test_extras(tmp_path):
    run_installs = [line for line in _make_dry_run("install", tmp_path).splitlines() if " -e '.[" in line]
    assert len(run_installs) == 1 and run_installs[0].endswith("-e '.[engine]'"), run_installs
    test_installs = [line for line in _make_dry_run("install-test", tmp_path).splitlines() if " -e '.[" in line]
    assert len(test_installs) == 1 and test_installs[0].endswith("-e '.[engine,test]'"), test_installs  # one resolve
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: style\b", makefile, flags=re.M) and re.search(r"^style: install-test", makefile, re.M)
    style, test = (makefile.split(f"\n{target}: ")[1].split("\n\n")[0] for target in ("style", "test"))
    assert "ruff check" in style and "bin/mypy" in test  # make test lints too (mypy beside the tests)


def test_make_test_leaves_make_run_nothing_to_install_and_an_installed_venv_is_not_installed_again(tmp_path):
    venv = tmp_path / "venv"
    last = _make_dry_run("install-test", tmp_path).splitlines()[-1]
    assert last == f"touch {venv}/.installed {venv}/.installed-test", last  # what make run checks, made current too
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()
    (venv / ".installed-test").touch()
    for target in ("install", "install-test"):
        assert "pip install" not in _make_dry_run(target, tmp_path)


def test_every_setting_in_env_example_passes_the_checks_every_process_runs_at_start(monkeypatch, tmp_path):
    from api.settings import ApiSettings
    from worker.settings import WorkerSettings

    monkeypatch.setenv("STEPWISE_VAR_DIR", str(tmp_path))  # no key in .env.example: the API makes one there
    for line in (ROOT / ".env.example").read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.startswith("#") and name.startswith("STEPWISE_"):
            monkeypatch.setenv(name, value)

    ApiSettings.from_env()
    WorkerSettings.from_env()


def test_the_two_workers_serve_two_models_with_the_same_settings_otherwise(compose):
    first, second = compose["services"]["worker"], compose["services"]["worker-2"]
    assert first["environment"]["STEPWISE_MODEL"] != second["environment"]["STEPWISE_MODEL"]
    assert first["command"] == second["command"] and first["stop_grace_period"] == second["stop_grace_period"]
    assert second["environment"]["STEPWISE_REDIS_URL"] == first["environment"]["STEPWISE_REDIS_URL"]


# Which services read each section of settings/table.py (the stepwise processes in them); `cli`, `compose`
# and `tests` variables are read by no container.
READERS = {
    "shared": {"api", "worker", "worker-2", "webhooks", "flower"},
    "api": {"api"},
    "server": {"api"},
    "worker": {"worker", "worker-2", "webhooks", "flower"},  # `celery -A worker` reads every worker setting
}
# Set in `environment`, over .env: how the containers find each other and their GPU, not the operator's choice.
WIRING = {
    "STEPWISE_REDIS_URL",
    "STEPWISE_STORAGE_URL",
    "STEPWISE_S3_ENDPOINT_URL",
    "STEPWISE_DEVICE",
    "STEPWISE_CACHE_DIR",
    "STEPWISE_SPOOL_DIR",
    "STEPWISE_WORKER_METRICS_PORT",
    "STEPWISE_WORKER_METRICS_HOST",
}
ENV_EXAMPLE = read_env_file(ROOT / ".env.example")
SECRETS = {"STEPWISE_WEBHOOK_SECRET", "S3_SECRET_ACCESS_KEY", "STEPWISE_API_KEYS", "STEPWISE_ADMIN_API_KEYS"}


def test_the_sections_of_the_settings_table_are_all_placed():
    assert set(READERS) | {"cli", "compose", "tests"} == set(SECTIONS)


@pytest.mark.parametrize("variable", [v for v in VARIABLES if v.section in READERS], ids=lambda v: v.name)
def test_every_variable_env_example_lists_reaches_the_services_that_read_it(compose, variable):
    for name in READERS[variable.section]:
        service = compose["services"][name]
        set_here = service.get("environment", {}).get(variable.name)
        if set_here is None:
            assert ".env" in service.get("env_file", []), f"{name} gets no .env: {variable.name} never reaches it"
        else:  # the operator's value, or wiring
            assert f"${{{variable.name}" in str(set_here) or variable.name in WIRING, (name, variable.name, set_here)


def test_compose_refuses_to_start_with_env_example_as_it_is_naming_each_secret_to_set():
    text = (ROOT / "docker-compose.yml").read_text()
    refused = set()
    env = dict(ENV_EXAMPLE)
    while True:  # compose names one; set it and look for the next, as an operator would
        try:
            interpolate(text, env)
            break
        except ComposeRefusal as e:
            assert e.name in str(e).split(":", 1)[1], f"the message does not name the variable: {e}"
            refused.add(e.name)
            env[e.name] = "set"

    assert refused == required_variables(text) == SECRETS | {"FLOWER_BASIC_AUTH"}
    assert all(ENV_EXAMPLE[name] == "" for name in refused)  # .env.example holds no usable secret


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("STEPWISE_API_KEYS", "team-a:change-me-a,team-b:change-me-b"),
        ("STEPWISE_ADMIN_API_KEYS", "ops:Change-Me-ops"),
        ("STEPWISE_WEBHOOK_SECRET", "whsec_Y2hhbmdlLW1lLWNoYW5nZS1tZS1jaGFuZ2UtbWUhIQ=="),  # once in .env.example
        ("STEPWISE_WEBHOOK_SECRET", "whsec_" + base64.b64encode(b"please-change-me-soon").decode()),
    ],
)
def test_every_stepwise_process_refuses_a_placeholder_secret_naming_the_variable(monkeypatch, tmp_path, name, value):
    from api.settings import ApiSettings
    from worker.settings import WorkerSettings

    monkeypatch.setenv("STEPWISE_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("STEPWISE_API_KEYS", "team-a:sk_a_real_one")
    monkeypatch.setenv(name, value)

    for read_settings in (ApiSettings.from_env, WorkerSettings.from_env):
        if name == "STEPWISE_WEBHOOK_SECRET" or read_settings is ApiSettings.from_env:  # the keys: the API's
            with pytest.raises(SettingsError, match=f"^{name} holds a placeholder"):
                read_settings()


def test_stepwise_api_refuses_a_change_me_key_with_one_line_naming_it(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "stepwise_cli.main", "api"],
        cwd=tmp_path,
        env=child_env(STEPWISE_API_KEYS="team-a:change-me-a"),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 2
    assert result.stderr.startswith("stepwise api: STEPWISE_API_KEYS holds a placeholder"), result.stderr
    assert "change-me-a" not in result.stderr  # a secret, even a bad one, is not echoed


def test_redis_and_s3_listen_on_the_compose_network_or_this_hosts_loopback_unless_the_operator_publishes(compose):
    as_given = load_compose(ROOT / "docker-compose.yml", {name: "set" for name in SECRETS | {"FLOWER_BASIC_AUTH"}})
    published = load_compose(
        ROOT / "docker-compose.yml",
        {**{name: "set" for name in SECRETS | {"FLOWER_BASIC_AUTH"}}, "STEPWISE_S3_BIND": "0.0.0.0"},
    )

    assert "ports" not in as_given["services"]["redis"] and "expose" not in as_given["services"]["redis"]
    assert as_given["services"]["s3"]["ports"] == ["127.0.0.1:9000:9000"]
    assert published["services"]["s3"]["ports"] == ["0.0.0.0:9000:9000"]
    assert as_given["services"]["api"]["ports"] == ["8000:8000"]  # the one service meant for clients


def test_on_a_one_gpu_host_both_workers_use_gpu_0_by_default_and_a_second_gpu_is_one_setting(compose):
    secrets = {name: "set" for name in SECRETS | {"FLOWER_BASIC_AUTH"}}
    one_gpu = load_compose(ROOT / "docker-compose.yml", secrets)["services"]
    two_gpus = load_compose(ROOT / "docker-compose.yml", {**secrets, "STEPWISE_WORKER_2_GPU": "1"})["services"]

    def gpus(services, name):
        return services[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]

    assert gpus(one_gpu, "worker") == gpus(one_gpu, "worker-2") == ["0"]
    assert gpus(two_gpus, "worker") == ["0"] and gpus(two_gpus, "worker-2") == ["1"]


def test_flower_is_built_from_the_projects_image_with_a_current_flower_from_its_extra(compose):
    flower = compose["services"]["flower"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    assert "image" not in flower and flower["build"]["args"]["EXTRAS"] == "[flower]"
    assert flower["command"][:3] == ["celery", "-A", "worker"]  # the app's broker and queues
    assert any(re.fullmatch(r"flower>=2\.2(\.\d+)?,<3", requirement) for requirement in extras["flower"])
