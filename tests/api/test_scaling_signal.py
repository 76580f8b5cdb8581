"""GET /v1/admin/scaling: one model's queued and running jobs, as KEDA's metrics-api scaler reads it
(deploy/kubernetes: `valueLocation: jobs`, a bearer admin key). In-process app, real Redis."""

from __future__ import annotations

from storage.job_store import JobStore
from storage.queue_names import generate_queue
from tests.support.calls import auth

BODY = {"prompt": "a quiet harbor", "seed": 3, "num_inference_steps": 2, "height": 64, "width": 64}


def scaling(client, model: str, tenant: str = "ops"):
    return client.get("/v1/admin/scaling", query_string={"model": model}, headers=auth(tenant))


def test_the_signal_counts_a_models_queued_and_running_jobs_and_is_zero_for_an_idle_model(client, redis_url):
    for _ in range(3):
        assert client.post("/v1/jobs", json=BODY, headers=auth("alice")).status_code == 202
    assert client.post("/v1/jobs", json={**BODY, "priority": "low"}, headers=auth("bob")).status_code == 202
    with JobStore(redis_url) as store:  # a worker takes one, as the generate task does
        assert store.take_next(generate_queue("builtin:tiny"), "gpu-1", 60) is not None

    busy = scaling(client, "builtin:tiny")
    idle = scaling(client, "builtin:small")

    assert busy.status_code == 200
    assert busy.get_json() == {"model": "builtin:tiny", "queued": 3, "running": 1, "jobs": 4, "workers": 0}
    assert idle.get_json()["jobs"] == 0


def test_only_an_admin_key_reads_the_signal_and_the_model_is_required(client):
    assert scaling(client, "builtin:tiny", tenant="alice").status_code == 403
    assert client.get("/v1/admin/scaling", query_string={"model": "builtin:tiny"}).status_code == 401

    missing = client.get("/v1/admin/scaling", headers=auth("ops"))

    assert missing.status_code == 422 and missing.get_json()["error"]["field"] == "model"
