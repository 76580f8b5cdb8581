"""Day-to-day operation against a real `stepwise api` serving builtin:tiny by configuration
(STEPWISE_MODELS), started before any worker: jobs are taken at once and run once a worker starts
20 s later; /readyz says the same as the submits, and shows a drained worker.

The module's tests run in order and share the processes: the worker starts in the last part, so
the tests before it see an API with no worker at all.
"""

from __future__ import annotations

import time

import pytest
from celery import Celery

from tests.api.calls import auth, submit, wait_for
from tests.api.processes import ApiProcess, WorkerProcess
from tests.worker.cluster import wait_for as poll

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
    import requests

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


def test_before_any_worker_a_configured_models_job_is_queued_and_readyz_says_it_waits(ops_api, http, early):
    job = http.get(f"{ops_api.url}/v1/jobs/{early['job_id']}", headers=auth(), timeout=10).json()
    assert job["state"] == "queued" and job["attempts"] == 0 and job["requeued"] is None

    ready = readiness(http, ops_api)

    assert ready["status"] == "ok"
    assert ready["models"] == [
        {"model": "builtin:tiny", "configured": True, "accepted": True, "available": False, "workers": 0, "draining": 0}
    ]
    assert any("builtin:tiny" in warning and "accepted and wait" in warning for warning in ready["warnings"])


def test_a_model_neither_configured_nor_seen_keeps_its_422_naming_the_served_ones(ops_api, http, early):
    refused = submit(http, ops_api, {"prompt": "x", "model": "builtin:small", **TINY})

    assert refused.status_code == 422 and refused.json()["error"]["field"] == "model"
    assert "served models: builtin:tiny" in refused.json()["error"]["message"]
    assert "builtin:small" not in {model["model"] for model in readiness(http, ops_api)["models"]}


def test_the_early_job_succeeds_once_a_worker_starts_20s_later(ops_api, http, early, late_worker):
    job = wait_for(http, ops_api, early["job_id"], {"succeeded"}, timeout=240)

    assert job["attempts"] == 1 and job["image_urls"]
    ready = readiness(http, ops_api)
    assert ready["models"][0]["available"] and ready["models"][0]["workers"] == 1
    assert not any("builtin:tiny" in warning for warning in ready["warnings"])


def test_a_drained_worker_is_shown_in_readyz_until_it_resumes(ops_api, http, module_redis, late_worker):
    control = Celery(broker=module_redis.url, set_as_current=False).control
    try:
        assert control.broadcast("drain", destination=[late_worker.hostname], reply=True, timeout=10)
        drained = poll(
            lambda: (ready := readiness(http, ops_api))["models"][0]["draining"] == 1 and ready,
            30,
            "readyz to show the drained worker",
        )
        assert drained["workers"]["num_draining"] == 1 and not drained["models"][0]["available"]
        assert any("draining" in warning and "resume" in warning for warning in drained["warnings"])

        assert control.broadcast("resume", destination=[late_worker.hostname], reply=True, timeout=10)
        poll(
            lambda: not (ready := readiness(http, ops_api))["warnings"] and ready["models"][0]["available"],
            30,
            "readyz to show the worker admitting again, without warnings",
        )
    finally:
        control.app.close()
