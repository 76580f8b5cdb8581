"""A fleet on one Redis: two real workers serving two built-in models, behind a real `stepwise api`
with its default of refusing jobs for models no worker serves; then priorities on one busy worker."""

from __future__ import annotations

import time

import pytest
from celery import Celery

from core.families import FAMILIES
from storage.job_store import JobStore
from storage.queue_names import generate_queue
from tests.support.calls import auth, get_job, submit, wait_for_job
from tests.support.processes import ApiProcess, WorkerProcess
from tests.support.waiting import wait_for

JOB_TIMEOUT = 240.0


def cheap(model: str, **fields) -> dict:
    return {
        "prompt": "a red fox",
        "model": model,
        "height": 64,
        "width": 64,
        "num_inference_steps": 4,
        "guidance_scale": 1.0,
        "seed": 3,
        **fields,
    }


def models_by_name(http, api) -> dict[str, dict]:
    response = http.get(f"{api.url}/v1/models", headers=auth(), timeout=10)
    assert response.status_code == 200, response.text
    return {entry["model"]: entry for entry in response.json()["models"]}


@pytest.fixture(scope="module")
def fleet_api(module_redis, storage_url, tmp_path_factory):
    server = ApiProcess(
        tmp_path_factory.mktemp("fleet-api"),
        module_redis.url,
        storage_url,
        STEPWISE_ACCEPT_UNSERVED_MODELS="false",
        STEPWISE_WORKER_TIMEOUT="5",
        STEPWISE_TENANT_MAX_PRIORITY="bob:normal",
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def workers(module_redis, storage_url, tmp_path_factory, fleet_api):
    """builtin:tiny (one job at a time, four jobs held at once: a busy worker) and builtin:small, started together."""
    common = {
        "STEPWISE_HEARTBEAT_INTERVAL": "0.5",
        "STEPWISE_MAX_NUM_SEQS": "1",
        "STEPWISE_WORKER_CONCURRENCY": "4",
        "OMP_NUM_THREADS": "1",
    }  # two workers on two cores
    tiny = WorkerProcess(
        tmp_path_factory.mktemp("tiny"), module_redis.url, storage_url, STEPWISE_MODEL="builtin:tiny", **common
    )
    small = WorkerProcess(
        tmp_path_factory.mktemp("small"), module_redis.url, storage_url, STEPWISE_MODEL="builtin:small", **common
    )
    tiny.launch(), small.launch()
    yield {"builtin:tiny": tiny.wait_ready(), "builtin:small": small.wait_ready(180)}
    tiny.stop(), small.stop()


@pytest.mark.e2e
def test_with_no_worker_every_model_is_refused_naming_model_and_none_is_listed(fleet_api, http):
    refused = submit(http, fleet_api, cheap("builtin:tiny"))
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "model"
    assert "served models: none" in refused.json()["error"]["message"]
    assert models_by_name(http, fleet_api) == {}


@pytest.mark.workers
def test_each_worker_serves_its_models_queue_and_takes_only_webhook_deliveries_from_celery(module_redis, workers):
    """Jobs are not Celery messages: a worker's feeder takes its model's jobs from that model's queue (its
    heartbeat names it); the one Celery queue it consumes is the webhook deliveries'."""
    control = Celery(broker=module_redis.url, set_as_current=False).control
    with JobStore(module_redis.url) as store:
        queue_of = {beat.model: beat.queue for beat in store.heartbeat_store.heartbeats(time.time())}
    assert queue_of == {model: generate_queue(model) for model in workers}
    for worker in workers.values():
        replies = control.inspect(destination=[worker.name], timeout=10).active_queues() or {}
        assert [queue["name"] for queue in replies.get(worker.name, [])] == ["stepwise.webhooks"], replies


@pytest.mark.workers
def test_models_are_listed_once_their_workers_run_and_unserved_models_and_fields_are_refused(fleet_api, http, workers):
    served = wait_for(
        lambda: (
            lambda m: m if {"builtin:tiny", "builtin:small"} <= {k for k, v in m.items() if v["available"]} else None
        )(models_by_name(http, fleet_api)),
        30,
        "both models to be listed as available",
    )
    for name in ("builtin:tiny", "builtin:small"):
        assert served[name]["workers"] == 1 and served[name]["capacity"] == 1 and served[name]["family"] == "sd"
        assert served[name]["limits"]["supports_lora"] is True and "num_running" in served[name]["engine"]
        assert served[name]["limits"]["samplers"] == list(FAMILIES["sd"].samplers)
        assert (served[name]["limits"]["init_image"], served[name]["limits"]["negative_prompt"]) == ("start", True)
    refused = submit(http, fleet_api, cheap("builtin:does-not-exist")).json()["error"]
    assert refused["field"] == "model"
    assert "builtin:small" in refused["message"] and "builtin:tiny" in refused["message"]
    lora = submit(http, fleet_api, cheap("builtin:tiny", lora="my-style"))  # the family takes adapters; no store here
    assert lora.status_code == 422 and lora.json()["error"]["field"] == "lora"
    assert "LoRA store" in lora.json()["error"]["message"]


@pytest.mark.workers
def test_a_busy_worker_starts_high_priority_jobs_before_an_earlier_backlog_and_still_finishes_low_ones(
    fleet_api, http, workers
):
    # Steps enough that each job outlasts a submit on a loaded machine (decodes run beside the loop now,
    # so a short job frees the engine's one slot almost at once).
    body = cheap("builtin:tiny", num_inference_steps=30)
    backlog = [submit(http, fleet_api, body).json()["job_id"] for _ in range(6)]
    wait_for_job(http, fleet_api, backlog[0], {"running", "succeeded"}, timeout=JOB_TIMEOUT)
    high = [submit(http, fleet_api, {**body, "priority": "high"}).json()["job_id"] for _ in range(2)]
    low = submit(http, fleet_api, {**body, "priority": "low"}).json()["job_id"]
    assert get_job(http, fleet_api, high[0]).json()["priority"] == "high"

    ended = {
        job_id: wait_for_job(http, fleet_api, job_id, {"succeeded"}, timeout=JOB_TIMEOUT)
        for job_id in [*backlog, *high, low]
    }
    finished = sorted(ended, key=lambda job_id: ended[job_id]["finished_at"])
    # One job at a time: finishing order is start order. One backlog job was running and at most one
    # more already admitted when the high ones reached the worker; every other one waited for them.
    # (Which backlog job is second depends on which worker thread reached the engine first, so the
    # test counts backlog jobs ahead of each high one rather than naming them.)
    names = {
        **{job_id: f"backlog-{i}" for i, job_id in enumerate(backlog)},
        **{job_id: f"high-{i}" for i, job_id in enumerate(high)},
        low: "low",
    }
    order = [names[j] for j in finished]
    for job_id in high:
        ahead = [j for j in finished[: finished.index(job_id)] if j in backlog]
        assert len(ahead) <= 2, order
    assert ended[low]["state"] == "succeeded"


@pytest.mark.workers
def test_a_tenant_limited_to_normal_priority_cannot_ask_for_high(fleet_api, http, workers):
    refused = submit(http, fleet_api, cheap("builtin:tiny", priority="high"), tenant="bob")
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "priority"


@pytest.mark.workers
def test_each_model_runs_on_its_own_worker_and_stopping_one_leaves_the_other_running_and_its_jobs_queued(
    fleet_api, http, workers
):
    job_ids = {
        model: [submit(http, fleet_api, cheap(model, seed=seed)).json()["job_id"] for seed in range(2)]
        for model in workers
    }
    for model, ids in job_ids.items():
        for job_id in ids:
            job = wait_for_job(http, fleet_api, job_id, {"succeeded"}, timeout=JOB_TIMEOUT)
            assert job["params"]["model"] == model

    workers["builtin:small"].stop()
    wait_for(
        lambda: not models_by_name(http, fleet_api)["builtin:small"]["available"],
        10,
        "builtin:small to show unavailable once its worker stopped",
    )
    assert models_by_name(http, fleet_api)["builtin:tiny"]["available"]
    waiting = submit(http, fleet_api, cheap("builtin:small"))
    assert waiting.status_code == 202, "a model that just lost its worker still accepts jobs (they queue)"
    tiny_job = submit(http, fleet_api, cheap("builtin:tiny")).json()["job_id"]
    assert wait_for_job(http, fleet_api, tiny_job, {"succeeded"}, timeout=JOB_TIMEOUT)["state"] == "succeeded"
    queued = get_job(http, fleet_api, waiting.json()["job_id"]).json()
    assert queued["state"] == "queued" and queued["queue_position"] == 0
    assert queued["queue"]["workers"] == 0 and queued["queue"]["eta_seconds"] is None
    assert models_by_name(http, fleet_api)["builtin:small"]["queue_depth"] == 1
