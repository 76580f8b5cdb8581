"""Day-to-day operation against a real `stepwise api` serving builtin:tiny by configuration
(STEPWISE_MODELS), started before any worker: jobs are taken at once and run once a worker starts
20 s later; /readyz says the same as the submits, and shows a drained worker.

The module's tests run in order and share the processes: the worker starts in the last part, so
the tests before it see an API with no worker at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from celery import Celery

from tests.support.calls import auth, submit, wait_for_job
from tests.support.processes import TENANT_KEYS, ApiProcess, WorkerProcess
from tests.support.servers import child_env
from tests.support.waiting import wait_for

WORKER_DELAY = 20.0  # seconds between the first submit and the worker's start
TINY = {"height": 64, "width": 64, "num_inference_steps": 4, "guidance_scale": 1.0}

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def ops_api(module_redis, storage_url, tmp_path_factory):
    server = ApiProcess(
        tmp_path_factory.mktemp("ops-api"),
        module_redis.url,
        storage_url,
        STEPWISE_ACCEPT_UNSERVED_MODELS="false",
        STEPWISE_MODELS="builtin:tiny",
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def early(ops_api, http_module):
    """A job submitted before any worker ever ran, and when."""
    response = submit(http_module, ops_api, {"prompt": "before any worker", **TINY})
    assert response.status_code == 202, response.text
    return {"job_id": response.json()["job_id"], "at": time.monotonic()}


@pytest.fixture(scope="module")
def http_module():
    with requests.Session() as session:
        yield session


@pytest.fixture(scope="module")
def late_worker(module_redis, storage_url, tmp_path_factory, early):
    time.sleep(max(0.0, early["at"] + WORKER_DELAY - time.monotonic()))
    process = WorkerProcess(
        tmp_path_factory.mktemp("late-worker"), module_redis.url, storage_url, STEPWISE_HEARTBEAT_INTERVAL="0.5"
    ).start()
    yield process
    process.stop()


def readiness(http, api) -> dict:
    response = http.get(f"{api.url}/readyz", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.e2e
def test_before_any_worker_a_configured_models_job_is_queued_and_readyz_says_it_waits(ops_api, http, early):
    job = http.get(f"{ops_api.url}/v1/jobs/{early['job_id']}", headers=auth(), timeout=10).json()
    assert job["state"] == "queued" and job["attempts"] == 0 and job["requeued"] is None

    ready = readiness(http, ops_api)

    assert ready["status"] == "ok"
    assert ready["models"] == [
        {"model": "builtin:tiny", "configured": True, "accepted": True, "available": False, "workers": 0, "draining": 0}
    ]
    assert any("builtin:tiny" in warning and "accepted and wait" in warning for warning in ready["warnings"])


@pytest.mark.e2e
def test_a_model_neither_configured_nor_seen_keeps_its_422_naming_the_served_ones(ops_api, http, early):
    refused = submit(http, ops_api, {"prompt": "x", "model": "builtin:small", **TINY})

    assert refused.status_code == 422 and refused.json()["error"]["field"] == "model"
    assert "served models: builtin:tiny" in refused.json()["error"]["message"]
    assert "builtin:small" not in {model["model"] for model in readiness(http, ops_api)["models"]}


def keys_cli(api: ApiProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stepwise_cli.main", "keys", *args],
        env=child_env(STEPWISE_REDIS_URL=api.env["STEPWISE_REDIS_URL"]),
        capture_output=True,
        text=True,
        timeout=60,
    )


def answer(http, api, path: str, key: str) -> requests.Response:
    return http.get(f"{api.url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=10)


@pytest.mark.e2e
def test_a_key_created_with_stepwise_keys_works_without_a_restart_until_it_is_revoked(ops_api, http, early):
    created = keys_cli(ops_api, "create", "--tenant", "dave")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    works = wait_for(lambda: answer(http, ops_api, "/v1/jobs", key).status_code == 200, 10, "the new key to work")
    assert works and answer(http, ops_api, "/metrics", key).status_code == 403  # a tenant key, not an operator's

    listed = json.loads(keys_cli(ops_api, "list", "--json").stdout)  # one document: a JSON array
    (entry,) = [entry for entry in listed if entry["tenant"] == "dave"]
    assert entry["scope"] == "tenant" and key not in json.dumps(listed) and key.startswith(entry["shown"])

    revoked = keys_cli(ops_api, "revoke", entry["key_id"])
    assert revoked.returncode == 0 and entry["key_id"] in revoked.stderr
    wait_for(lambda: answer(http, ops_api, "/v1/jobs", key).status_code == 401, 10, "the revoked key to be refused")
    assert answer(http, ops_api, "/v1/jobs", TENANT_KEYS["alice"]).status_code == 200  # environment keys still work
    assert keys_cli(ops_api, "revoke", key).returncode == 1  # already gone


@pytest.mark.e2e
def test_a_command_whose_reader_went_away_exits_quietly_as_a_pipe_to_head_expects(ops_api):
    assert keys_cli(ops_api, "create", "--tenant", "erin").returncode == 0  # a line to print
    listing = subprocess.Popen(  # `stepwise keys list | head -0`: the reader is gone before the first line
        [sys.executable, "-m", "stepwise_cli.main", "keys", "list"],
        env=child_env(STEPWISE_REDIS_URL=ops_api.env["STEPWISE_REDIS_URL"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    listing.stdout.close()
    stderr = listing.stderr.read()

    assert listing.wait(60) == 141, stderr  # as a shell shows a command SIGPIPE stopped (128 + 13)
    assert stderr == ""  # no BrokenPipeError traceback


@pytest.mark.e2e
def test_an_admin_key_reads_metrics_and_every_tenants_queue_totals_and_no_series_names_a_tenant(ops_api, http, early):
    key = keys_cli(ops_api, "create", "--tenant", "operators", "--admin").stdout.strip()
    metrics = wait_for(lambda: (r := answer(http, ops_api, "/metrics", key)).status_code == 200 and r, 10, "metrics")

    assert "stepwise_jobs" in metrics.text and "alice" not in metrics.text and "tenant" not in metrics.text
    totals = answer(http, ops_api, "/v1/admin/tenants", key).json()["tenants"]
    assert {"tenant": "alice", "queued": 1, "running": 0} in totals
    assert answer(http, ops_api, "/v1/admin/tenants", TENANT_KEYS["alice"]).status_code == 403


@pytest.mark.e2e
def test_a_bearer_token_beyond_ascii_is_an_invalid_key_not_a_missing_one(ops_api, http):
    response = http.get(f"{ops_api.url}/v1/jobs", headers={"Authorization": "Bearer sk_ключ".encode()}, timeout=10)

    assert response.status_code == 401 and response.json()["error"]["message"] == "invalid API key"


@pytest.mark.workers
def test_the_early_job_succeeds_once_a_worker_starts_20s_later(ops_api, http, early, late_worker):
    job = wait_for_job(http, ops_api, early["job_id"], {"succeeded"}, timeout=240)

    assert job["attempts"] == 1 and job["image_urls"]
    ready = readiness(http, ops_api)
    assert ready["models"][0]["available"] and ready["models"][0]["workers"] == 1
    assert not any("builtin:tiny" in warning for warning in ready["warnings"])


@pytest.mark.workers
def test_deleting_a_succeeded_job_removes_its_images_and_a_running_one_is_stopped_first(
    ops_api, http, early, late_worker, storage_url
):
    images = Path(storage_url.removeprefix("file://")) / early["job_id"]
    assert any(images.iterdir())
    running = submit(http, ops_api, {"prompt": "deleted while running", **TINY, "num_inference_steps": 60}).json()

    assert http.delete(f"{ops_api.url}/v1/jobs/{early['job_id']}", headers=auth(), timeout=10).status_code == 204
    assert not images.exists()
    wait_for(
        lambda: http.get(running["status_url"], headers=auth(), timeout=10).json()["progress"]["step"] >= 1,
        120,
        "the second job to run",
    )
    assert http.delete(running["status_url"], headers=auth(), timeout=10).status_code == 204

    wait_for(lambda: "deleted by its tenant" in late_worker.log_tail(), 60, "the worker to stop the deleted job")
    assert http.get(running["status_url"], headers=auth(), timeout=10).status_code == 404
    assert not (images.parent / running["job_id"]).exists()


@pytest.mark.workers
def test_a_drained_worker_is_shown_in_readyz_until_it_resumes(ops_api, http, module_redis, late_worker):
    control = Celery(broker=module_redis.url, set_as_current=False).control
    try:
        assert control.broadcast("drain", destination=[late_worker.name], reply=True, timeout=10)
        drained = wait_for(
            lambda: (ready := readiness(http, ops_api))["models"][0]["draining"] == 1 and ready,
            30,
            "readyz to show the drained worker",
        )
        assert drained["workers"]["num_draining"] == 1 and not drained["models"][0]["available"]
        assert any("draining" in warning and "resume" in warning for warning in drained["warnings"])

        assert control.broadcast("resume", destination=[late_worker.name], reply=True, timeout=10)
        wait_for(
            lambda: not (ready := readiness(http, ops_api))["warnings"] and ready["models"][0]["available"],
            30,
            "readyz to show the worker admitting again, without warnings",
        )
    finally:
        control.app.close()
