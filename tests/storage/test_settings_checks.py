"""Every process checks its settings when it starts: a malformed value is refused with one line naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from api.settings import ApiSettings
from tests.support.servers import child_env
from worker.settings import WorkerSettings

BAD_SETTINGS = [
    ("STEPWISE_WEBHOOK_SECRET", "whsec_change-me"),
    ("STEPWISE_WEBHOOK_SECRET", "whsec_"),
    ("STEPWISE_REDIS_URL", "localhost:6379"),
    ("STEPWISE_STORAGE_URL", "/srv/images"),
    ("STEPWISE_S3_ENDPOINT_URL", "minio:9000"),
    ("STEPWISE_S3_PUBLIC_URL", "localhost:9000"),
    ("STEPWISE_PRESIGN_EXPIRY", "0"),
    ("STEPWISE_JOB_LEASE_SECONDS", "soon"),
    ("STEPWISE_PUBLIC_URL", "example.com"),
    ("STEPWISE_MAX_PIXELS", "-1"),
    ("STEPWISE_MODEL_LIMITS", "{not json"),
    ("STEPWISE_MODEL_LIMITS", '{"builtin:tiny": {"max_steps": 5}}'),
    ("STEPWISE_DEVICE", "gpu"),
    ("STEPWISE_DETERMINISTIC", "maybe"),
    ("STEPWISE_ENCODE_OVERLAP", "yes"),
    ("STEPWISE_DECODE_OVERLAP", "sometimes"),
    ("STEPWISE_WORKER_POLL_INTERVAL", "0"),
    ("STEPWISE_WORKER_METRICS_PORT", "70000"),
    ("STEPWISE_MAX_NUM_TOKENS", "-5"),
    ("STEPWISE_MAX_NUM_TOKENS", "many"),
    ("STEPWISE_TENANT_WEIGHTS", "gold=4"),
    ("STEPWISE_TENANT_WEIGHTS", "gold:0"),
    ("STEPWISE_TENANT_WEIGHTS", "gold:-1"),
    ("STEPWISE_TENANT_WEIGHTS", "gold:nan"),
    ("STEPWISE_TENANT_WEIGHTS", "gold:inf"),
    ("STEPWISE_TENANT_WEIGHTS", ":2"),
    ("STEPWISE_TENANT_WEIGHTS", "gold:2,gold:3"),
]


@pytest.mark.parametrize(("name", "value"), BAD_SETTINGS)
def test_a_malformed_setting_is_refused_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv("STEPWISE_API_KEYS", "local:sk_test_key")
    monkeypatch.setenv(name, value)

    with pytest.raises(ValueError, match=name):
        ApiSettings.from_env()
        WorkerSettings.from_env()


@pytest.mark.parametrize("command", ["api", "worker"])
def test_stepwise_api_and_worker_refuse_a_bad_webhook_secret_with_one_line(tmp_path, command):
    env = child_env(STEPWISE_API_KEYS="local:sk_test_key", STEPWISE_WEBHOOK_SECRET="whsec_change-me")
    result = subprocess.run(
        [sys.executable, "-m", "stepwise_cli.main", command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"stepwise {command}: STEPWISE_WEBHOOK_SECRET"), result.stderr


def test_the_token_budget_setting_reaches_the_worker_settings(monkeypatch):
    monkeypatch.setenv("STEPWISE_MAX_NUM_TOKENS", "4096")
    assert WorkerSettings.from_env().max_num_tokens == 4096
    monkeypatch.delenv("STEPWISE_MAX_NUM_TOKENS")
    assert WorkerSettings.from_env().max_num_tokens == 0  # derived by the engine from max_num_seqs
