"""Finish-by deadlines (complete_by / slo_seconds) and queue positions in the fair order, through the
real Flask app (its test client) on a real Redis, with no worker: jobs stay queued."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from api import create_app
from api.resources import get_job_store, get_task_queue
from api.settings import ApiSettings
from storage.fair_share import TenantWeights
from storage.settings import StorageSettings
from tests.support.job_factories import take_job

KEYS = {"bulk": "sk_fair_bulk", "alice": "sk_fair_alice"}
BODY = {"prompt": "a paper boat", "seed": 1, "num_inference_steps": 2, "model": "builtin:tiny"}


def headers(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def at(seconds_from_now: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds_from_now)).isoformat()


def when(view_time: str) -> float:
    return datetime.fromisoformat(view_time.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def client(redis_url, tmp_path):
    settings = ApiSettings(
        api_keys=tuple(KEYS.items()),
        storage=StorageSettings(
            redis_url=redis_url, storage_url=tmp_path.as_uri(), tenant_weights=TenantWeights({"alice": 2.0})
        ),
        accept_unserved_models=True,
    )
    app = create_app({"API_SETTINGS": settings, "TESTING": True})
    yield app.test_client()
    with app.app_context():
        get_task_queue().close()
        get_job_store().close()


def submit(client, tenant: str, **fields):
    return client.post("/v1/jobs", json={**BODY, **fields}, headers=headers(tenant))


def test_complete_by_and_slo_seconds_are_kept_in_the_view_and_a_fresh_job_is_not_late(client):
    by_time = submit(client, "alice", complete_by=at(600))
    by_slo = submit(client, "alice", slo_seconds=90)
    none = submit(client, "alice")

    assert by_time.status_code == 202 and by_slo.status_code == 202, by_time.text + by_slo.text
    assert abs(when(by_time.json["complete_by"]) - (datetime.now(UTC).timestamp() + 600)) < 5
    slo_view = by_slo.json
    assert abs(when(slo_view["complete_by"]) - when(slo_view["created_at"]) - 90) < 0.01
    assert none.json["complete_by"] is None
    for view in (by_time.json, slo_view, none.json):
        assert view["late"] is False and view["paused"] is False
    fetched = client.get(f"/v1/jobs/{slo_view['job_id']}", headers=headers("alice")).json
    assert fetched["complete_by"] == slo_view["complete_by"]


def test_complete_by_with_slo_seconds_is_refused_naming_slo_seconds(client):
    response = submit(client, "alice", complete_by=at(600), slo_seconds=60)

    assert response.status_code == 422
    assert response.json["error"]["field"] == "slo_seconds" and "complete_by" in response.json["error"]["message"]


def test_a_batch_item_with_a_bad_complete_by_is_refused_naming_its_field(client):
    response = client.post(
        "/v1/jobs/batch", json={"jobs": [BODY, {**BODY, "complete_by": at(-60)}]}, headers=headers("alice")
    )

    results = response.json["results"]
    assert results[0]["status"] == 202
    assert results[1]["status"] == 422 and results[1]["error"]["field"] == "jobs[1].complete_by"


def test_queue_positions_follow_the_fair_order_across_tenants_and_weights(client):
    backlog = [submit(client, "bulk").json for _ in range(10)]
    mine = [submit(client, "alice").json for _ in range(4)]

    assert [view["queue_position"] for view in backlog[:3]] == [0, 1, 2]
    # alice weighs 2: each of her 2-step jobs moves her tag on by 1 step, bulk's by 2: tags 0, 1, 2, 3 against
    # bulk's 0, 2, 4... (equal tags may go either way), so her four jobs interleave with bulk's first two.
    reported = [client.get(f"/v1/jobs/{view['job_id']}", headers=headers("alice")).json for view in mine]
    positions = [view["queue_position"] for view in reported]
    assert positions[0] in (0, 1) and positions[1] == 2 and positions[2] in (3, 4) and positions[3] == 5, positions
    bulk_now = client.get(f"/v1/jobs/{backlog[5]['job_id']}", headers=headers("bulk")).json
    assert bulk_now["queue_position"] == 5 + 4, "all of alice's jobs come before bulk's sixth"
    assert bulk_now["queue"]["jobs_ahead"] == 9


def test_a_running_job_shows_paused_and_late_as_its_worker_reports_and_late_stays_once_it_finished_after(
    client, redis_url
):
    from storage.job_store import JobState, JobStore

    job = submit(client, "alice", slo_seconds=0.3).json
    view = lambda: client.get(f"/v1/jobs/{job['job_id']}", headers=headers("alice")).json  # noqa: E731
    with JobStore(redis_url) as store:
        holder = take_job(store, job["job_id"]).holder
        store.set_progress(job["job_id"], 1, 2, is_paused=True, is_late=True)
        assert (view()["state"], view()["paused"], view()["late"]) == ("running", True, True)
        store.set_progress(job["job_id"], 2, 2)
        assert view()["paused"] is False
        while time.time() <= when(job["complete_by"]) + 0.001:  # the view shows complete_by to the millisecond
            time.sleep(0.05)
        store.finish(job["job_id"], JobState.SUCCEEDED, holder=holder)
    finished = view()
    assert finished["state"] == "succeeded" and finished["late"] is True and finished["paused"] is False
