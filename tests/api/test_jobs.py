"""Submit, poll, list, cancel and batch over real HTTP against `stepwise api` (no worker: jobs stay queued)."""

from __future__ import annotations

import uuid

import pytest

from tests.support.calls import auth, get_job, submit

BODY = {"prompt": "a lighthouse at dusk", "seed": 11, "num_inference_steps": 3, "height": 64, "width": 64}


@pytest.mark.e2e
def test_submit_answers_202_with_the_job_and_its_urls(api, http):
    response = submit(http, api, BODY)

    assert response.status_code == 202, response.text
    job = response.json()
    assert job["state"] == "queued"
    assert isinstance(job["queue_position"], int) and job["queue_position"] >= 0
    assert job["status_url"] == f"{api.url}/v1/jobs/{job['job_id']}"
    assert job["cancel_url"] == f"{api.url}/v1/jobs/{job['job_id']}/cancel"
    assert response.headers["Location"] == job["status_url"]
    assert job["params"]["seed"] == 11 and job["params"]["sampler"] == "euler"
    assert job["image_url"] is None and job["error"] is None


@pytest.mark.e2e
def test_a_random_seed_is_drawn_and_recorded(api, http):
    job = submit(http, api, {"prompt": "seedless"}).json()

    assert isinstance(job["params"]["seed"], int)


@pytest.mark.e2e
def test_poll_shows_the_same_job_with_timestamps_and_progress(api, http):
    submitted = submit(http, api, BODY).json()

    response = http.get(submitted["status_url"], headers=auth(), timeout=10)

    assert response.status_code == 200
    job = response.json()
    assert job["job_id"] == submitted["job_id"]
    assert job["created_at"].endswith("Z") and job["started_at"] is None
    assert job["progress"] == {"step": 0, "total": BODY["num_inference_steps"]}  # the job's own steps
    assert job["queue_position"] is not None


@pytest.mark.e2e
def test_queue_position_counts_the_jobs_ahead(api, http):
    first = submit(http, api, BODY).json()
    second = submit(http, api, BODY).json()

    assert second["queue_position"] == first["queue_position"] + 1


@pytest.mark.e2e
def test_the_same_idempotency_key_and_body_return_the_original_job(api, http):
    key = uuid.uuid4().hex
    first = submit(http, api, BODY, **{"Idempotency-Key": key})
    again = submit(http, api, BODY, **{"Idempotency-Key": key})

    assert first.status_code == again.status_code == 202
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.headers.get("Idempotent-Replayed") == "true"


@pytest.mark.e2e
def test_the_same_idempotency_key_with_another_body_gets_409(api, http):
    key = uuid.uuid4().hex
    submit(http, api, BODY, **{"Idempotency-Key": key})

    response = submit(http, api, {**BODY, "seed": 12}, **{"Idempotency-Key": key})

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_conflict"


@pytest.mark.e2e
def test_idempotency_keys_belong_to_their_tenant(api, http):
    key = uuid.uuid4().hex
    alice = submit(http, api, BODY, "alice", **{"Idempotency-Key": key}).json()
    bob = submit(http, api, {**BODY, "seed": 99}, "bob", **{"Idempotency-Key": key})

    assert bob.status_code == 202
    assert bob.json()["job_id"] != alice["job_id"]


@pytest.mark.e2e
def test_canceling_a_queued_job_cancels_it_at_once(api, http):
    job = submit(http, api, BODY).json()

    response = http.post(job["cancel_url"], headers=auth(), timeout=10)

    assert response.status_code == 200
    assert response.json()["state"] == "canceled"
    assert get_job(http, api, job["job_id"]).json()["state"] == "canceled"


@pytest.mark.e2e
def test_canceling_a_finished_job_gets_409(api, http):
    job = submit(http, api, BODY).json()
    http.post(job["cancel_url"], headers=auth(), timeout=10)

    response = http.post(job["cancel_url"], headers=auth(), timeout=10)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "job_finished"


@pytest.mark.e2e
def test_the_image_of_a_job_that_has_not_succeeded_gets_409(api, http):
    job = submit(http, api, BODY).json()

    response = http.get(f"{job['status_url']}/image", headers=auth(), timeout=10)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "no_image"


@pytest.mark.e2e
def test_listing_shows_only_the_callers_jobs_newest_first_in_pages(api, http):
    job_ids = [submit(http, api, {**BODY, "seed": seed}, "carol").json()["job_id"] for seed in range(5)]
    submit(http, api, BODY, "alice")

    seen, cursor = [], None
    for _ in range(10):
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = http.get(f"{api.url}/v1/jobs", params=params, headers=auth("carol"), timeout=10).json()
        assert len(page["jobs"]) <= 2
        seen += [job["job_id"] for job in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break

    assert seen == list(reversed(job_ids))


@pytest.mark.e2e
def test_listing_filters_by_state(api, http):
    queued = submit(http, api, BODY, "carol").json()
    canceled = submit(http, api, BODY, "carol").json()
    http.post(canceled["cancel_url"], headers=auth("carol"), timeout=10)

    page = http.get(
        f"{api.url}/v1/jobs", params={"state": "canceled", "limit": 100}, headers=auth("carol"), timeout=10
    ).json()

    ids = {job["job_id"] for job in page["jobs"]}
    assert canceled["job_id"] in ids and queued["job_id"] not in ids
    assert {job["state"] for job in page["jobs"]} == {"canceled"}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"state": "done"}, "state"),
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"cursor": "not-a-cursor!"}, "cursor"),
    ],
)
@pytest.mark.e2e
def test_bad_listing_parameters_get_422_naming_them(api, http, params, field):
    response = http.get(f"{api.url}/v1/jobs", params=params, headers=auth(), timeout=10)

    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


@pytest.mark.e2e
def test_a_batch_validates_each_job_and_answers_per_item(api, http):
    jobs = [BODY, {**BODY, "height": 65}, "not a job", {**BODY, "seed": 5}]

    response = http.post(f"{api.url}/v1/jobs/batch", json={"jobs": jobs}, headers=auth(), timeout=10)

    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [result["status"] for result in results] == [202, 422, 422, 202]
    assert results[1]["error"]["field"] == "jobs[1].height"
    assert results[2]["error"]["field"] == "jobs[2]"
    assert response.json()["num_accepted"] == 2
    assert get_job(http, api, results[3]["job"]["job_id"]).json()["params"]["seed"] == 5


@pytest.mark.e2e
def test_a_batch_over_the_limit_gets_422(api, http):
    response = http.post(f"{api.url}/v1/jobs/batch", json={"jobs": [BODY] * 101}, headers=auth(), timeout=10)

    assert response.status_code == 422
    assert response.json()["error"]["field"] == "jobs"


@pytest.mark.e2e
def test_a_replayed_batch_returns_the_same_jobs(api, http):
    key = uuid.uuid4().hex
    headers = {**auth(), "Idempotency-Key": key}
    body = {"jobs": [BODY, {**BODY, "seed": 2}]}

    first = http.post(f"{api.url}/v1/jobs/batch", json=body, headers=headers, timeout=10).json()
    again = http.post(f"{api.url}/v1/jobs/batch", json=body, headers=headers, timeout=10).json()

    assert [r["job"]["job_id"] for r in again["results"]] == [r["job"]["job_id"] for r in first["results"]]


@pytest.mark.e2e
def test_deleting_a_queued_job_cancels_and_removes_it_and_another_tenant_gets_404(api, http):
    job = submit(http, api, BODY).json()

    assert http.delete(job["status_url"], headers=auth("bob"), timeout=10).status_code == 404
    assert http.delete(job["status_url"], headers=auth(), timeout=10).status_code == 204

    assert get_job(http, api, job["job_id"]).status_code == 404
    assert http.delete(job["status_url"], headers=auth(), timeout=10).status_code == 404
    listed = http.get(f"{api.url}/v1/jobs", params={"limit": 100}, headers=auth(), timeout=10).json()["jobs"]
    assert job["job_id"] not in {entry["job_id"] for entry in listed}


def test_get_on_the_batch_route_is_405_with_the_methods_it_allows(client):
    for method in ("GET", "DELETE", "OPTIONS"):
        response = client.open("/v1/jobs/batch", method=method, headers=auth())

        assert set(response.headers["Allow"].replace(" ", "").split(",")) == {"POST", "OPTIONS"}, method
        assert response.status_code == (200 if method == "OPTIONS" else 405), method
