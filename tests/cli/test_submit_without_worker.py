"""`stepwise submit` against an API whose queue no worker serves: it says so (or that its worker is
draining), and `--wait` gives up after `--no-worker-timeout` instead of waiting out its whole timeout."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from storage.heartbeats import Heartbeat
from storage.job_store import JobStore
from storage.queue_names import generate_queue
from tests.support.processes import TENANT_KEYS, ApiProcess
from tests.support.servers import RedisServer, child_env

pytestmark = pytest.mark.e2e

STEPWISE = [sys.executable, "-m", "stepwise_cli.main"]


@pytest.fixture(scope="module")
def lonely_api(tmp_path_factory):
    root = tmp_path_factory.mktemp("lonely")
    redis = RedisServer(root / "redis", appendonly=False).start()
    api = ApiProcess(root, redis.url, (root / "images").as_uri()).start()  # accepts jobs for unserved models
    api.redis_url = redis.url
    yield api
    api.stop()
    redis.stop()


def submit(api: ApiProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *STEPWISE,
            "submit",
            "a red fox",
            "--size",
            "64",
            "--steps",
            "4",
            "--api-url",
            api.url,
            "--api-key",
            TENANT_KEYS["alice"],
            *args,
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_submit_warns_that_no_worker_serves_the_model_and_still_queues_the_job(lonely_api):
    result = submit(lonely_api)

    assert result.returncode == 0, result.stderr
    assert "queued" in result.stdout
    assert "no worker serving 'builtin:tiny' has been seen recently" in result.stderr


def test_submit_wait_gives_up_after_the_no_worker_timeout_not_the_job_timeout(lonely_api):
    started = time.monotonic()
    result = submit(lonely_api, "--wait", "--no-worker-timeout", "2", "--timeout", "600")

    assert result.returncode == 1
    assert "is still queued: no worker serving 'builtin:tiny' has been seen for" in result.stderr
    assert time.monotonic() - started < 60


def test_submit_says_the_models_worker_is_draining_rather_than_that_none_was_seen(lonely_api):
    store = JobStore(lonely_api.redis_url)
    drained = Heartbeat(  # what a worker that an operator drained (`celery control drain`) writes every beat
        "drained-worker",
        "builtin:tiny",
        generate_queue("builtin:tiny"),
        "sd",
        capacity=4,
        seen_at=time.time(),
        is_admitting=False,
        is_draining=True,
    )
    try:
        store.beat(drained)
        result = submit(lonely_api)
    finally:
        store.redis.hdel(store.heartbeat_store.key, drained.worker_id)  # the other tests have no worker at all
        store.close()

    assert result.returncode == 0, result.stderr
    assert "its worker is draining" in result.stderr and "control resume" in result.stderr
    assert "has been seen" not in result.stderr
