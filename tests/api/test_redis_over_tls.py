"""End to end over a Redis that speaks only TLS and asks every client for a certificate (as managed Redis
services do, `rediss://`): `stepwise api`, a generate worker and a webhook worker (Celery's broker and
result backend, the job records, the event feed), `stepwise keys` and `celery -A worker inspect`, each given
the same `rediss://` URL with its CA file and client certificate. A component that ignored the URL's TLS
options could not even connect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from storage.job_record import TERMINAL_STATE_NAMES
from tests.support.processes import ApiProcess, WorkerProcess
from tests.support.servers import RedisServer, TlsFiles, child_env
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.workers

SMALL = {"prompt": "a red fox", "seed": 7, "num_inference_steps": 3, "height": 64, "width": 64, "guidance_scale": 1.0}


@pytest.fixture
def tls_redis(tmp_path):
    server = RedisServer(tmp_path / "redis", appendonly=False, tls=TlsFiles(tmp_path / "tls")).start()
    yield server
    server.stop()


def stepwise(*args: str, redis_url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stepwise_cli.main", *args],
        env=child_env(STEPWISE_REDIS_URL=redis_url),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_job_runs_end_to_end_over_rediss_with_a_client_certificate(tls_redis, tmp_path, http):
    storage_url = (tmp_path / "images").as_uri()
    processes = [
        ApiProcess(tmp_path / "api", tls_redis.url, storage_url, workers=1),
        WorkerProcess(tmp_path, tls_redis.url, storage_url, label="generate", queues="stepwise.generate"),
        WorkerProcess(tmp_path, tls_redis.url, storage_url, label="webhooks", queues="stepwise.webhooks"),
    ]
    try:
        for process in processes:
            process.launch()
        api, generator, _ = (process.wait_ready() for process in processes)
        created = stepwise("keys", "create", "--tenant", "dana", redis_url=tls_redis.url)
        assert created.returncode == 0, created.stderr
        dana = {"Authorization": f"Bearer {created.stdout.strip()}"}  # kept in Redis, read by the API over TLS

        with WebhookReceiver() as receiver:
            body = {**SMALL, "webhook_url": receiver.url("/hooks/tls")}
            response = http.post(f"{api.url}/v1/jobs", json=body, headers=dana, timeout=10)
            assert response.status_code == 202, response.text
            job_url = f"{api.url}/v1/jobs/{response.json()['job_id']}"
            done = wait_for(lambda: ended(http.get(job_url, headers=dana, timeout=10).json()), 240, "the job to end")
            deliveries = receiver.wait_for("/hooks/tls", lambda got: len(got) >= 2)  # the webhook worker's
        image = http.get(done["image_url"], headers=dana, timeout=30)
        ping = subprocess.run(
            [str(Path(sys.executable).with_name("celery")), "-A", "worker", "inspect", "ping", "-t", "10"],
            env=child_env(STEPWISE_REDIS_URL=tls_redis.url),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        for process in processes:
            process.stop()

    assert done["state"] == "succeeded", done
    assert image.status_code == 200 and image.content.startswith(b"\x89PNG")
    assert sorted(d.payload["type"] for d in deliveries) == ["job.completed", "job.started"]
    assert ping.returncode == 0 and f"{generator.name}: OK" in ping.stdout, ping.stdout + ping.stderr
    assert "stepwise: Redis rediss://127.0.0.1:" in ping.stderr and "(STEPWISE_REDIS_URL)" in ping.stderr


def ended(view: dict) -> dict | None:
    return view if view["state"] in TERMINAL_STATE_NAMES else None
