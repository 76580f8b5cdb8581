"""Request rules an adversarial probe found holes in, checked in-process (Flask's test client
against a real Redis): content types, deadlines, cursors, queue room per batch item, per-tenant
quotas, idempotency key spaces, and views that one odd stored record cannot break."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from api import create_app
from api.resources import get_job_store, get_task_queue
from api.settings import ApiSettings
from storage.job_store import JobStore
from storage.settings import StorageSettings

KEYS = {"alice": "sk_rules_alice", "bob": "sk_rules_bob"}
BODY = {"prompt": "a paper boat", "seed": 1, "num_inference_steps": 2}
STATES = ("queued", "running", "succeeded", "failed", "canceled", "expired")


def auth(tenant: str = "alice") -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


@pytest.fixture
def make_client(redis_url, tmp_path):
    apps = []

    def make(**limits):
        settings = ApiSettings(
            api_keys=tuple(KEYS.items()),
            storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()),
            accept_unserved_models=True,
            **limits,
        )  # no worker here: jobs stay queued
        app = create_app({"API_SETTINGS": settings, "TESTING": True})
        apps.append(app)
        return app.test_client()

    yield make
    for app in apps:
        with app.app_context():
            get_task_queue().close()
            get_job_store().close()


@pytest.fixture
def client(make_client):
    """Shadows tests/api/conftest.py's `client`: two tenants and the limits each test sets."""
    return make_client()


def submit(client, body=BODY, tenant="alice", **headers):
    return client.post("/v1/jobs", json=body, headers={**auth(tenant), **headers})


def batch(client, items, tenant="alice", **headers):
    return client.post("/v1/jobs/batch", json={"jobs": items}, headers={**auth(tenant), **headers})


# -- content types (item 9) -----------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/jobs/batch"])
def test_a_body_not_sent_as_json_gets_415_and_nothing_is_queued(client, redis_url, path, content_type):
    body = json.dumps(BODY if path == "/v1/jobs" else {"jobs": [BODY]})
    headers = auth() if content_type is None else {**auth(), "Content-Type": content_type}

    response = client.post(path, data=body, headers=headers)

    assert response.status_code == 415, response.text
    assert response.json["error"]["code"] == "unsupported_media_type"
    assert JobStore(redis_url).queue_depth() == 0


def test_json_with_a_charset_or_a_json_suffix_type_is_accepted(client):
    for content_type in ("application/json; charset=utf-8", "application/merge-patch+json"):
        response = client.post("/v1/jobs", data=json.dumps(BODY), headers={**auth(), "Content-Type": content_type})
        assert response.status_code == 202, response.text


# -- deadlines (item 3) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "deadline", ["9999-12-31T23:59:59-12:00", "2300-01-01T00:00:00Z", 1900000000, "1900000000", 1.9e9, True]
)
def test_a_far_or_numeric_deadline_gets_422_naming_deadline_and_nothing_is_stored(client, redis_url, deadline):
    single = submit(client, {**BODY, "deadline": deadline})
    in_batch = batch(client, [BODY, {**BODY, "deadline": deadline}])

    assert single.status_code == 422 and single.json["error"]["field"] == "deadline", single.text
    assert in_batch.status_code == 200
    assert [r["status"] for r in in_batch.json["results"]] == [202, 422]
    assert in_batch.json["results"][1]["error"]["field"] == "jobs[1].deadline"
    assert JobStore(redis_url).queue_depth() == 1  # only the batch's valid item


def test_a_deadline_within_thirty_days_in_rfc_3339_is_kept(client):
    deadline = (datetime.now(UTC) + timedelta(days=29)).replace(microsecond=0)

    response = submit(client, {**BODY, "deadline": deadline.isoformat()})

    assert response.status_code == 202, response.text
    assert datetime.fromisoformat(response.json["deadline"].replace("Z", "+00:00")) == deadline


def test_one_stored_record_with_an_unrepresentable_deadline_breaks_no_view(client, redis_url):
    store = JobStore(redis_url)
    for _ in range(3):
        assert submit(client).status_code == 202
    odd, _ = store.create(
        tenant="alice", params={"prompt": "odd", "num_inference_steps": 2}, deadline=253402343999.0
    )  # 9999-12-31T23:59:59-12:00, stored by an older API

    assert client.get(f"/v1/jobs/{odd.job_id}", headers=auth()).status_code == 200
    assert client.head(f"/v1/jobs/{odd.job_id}", headers=auth()).status_code == 200
    for state in (None, *STATES):
        query = {"state": state} if state else {}
        assert client.get("/v1/jobs", query_string=query, headers=auth()).status_code == 200
        assert client.head("/v1/jobs", query_string=query, headers=auth()).status_code == 200
    seen, cursor = [], None
    while True:
        page = client.get(
            "/v1/jobs", query_string={"limit": 1, **({"cursor": cursor} if cursor else {})}, headers=auth()
        )
        assert page.status_code == 200, page.text
        seen += [job["job_id"] for job in page.json["jobs"]]
        cursor = page.json["next_cursor"]
        if cursor is None:
            break
    assert odd.job_id in seen and len(seen) == 4


# -- cursors (item 4) -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cursor", ["nan-" + "a" * 32, "inf-" + "a" * 32, "1e999-" + "a" * 32, "5.0-", "-5.0-" + "a" * 32, "bmFuOng"]
)
def test_a_cursor_that_is_no_finite_position_gets_422_naming_cursor(client, cursor):
    response = client.get("/v1/jobs", query_string={"cursor": cursor}, headers=auth())

    assert response.status_code == 422, response.text
    assert response.json["error"]["field"] == "cursor"


# -- queue room and tenant quotas (item 5) --------------------------------------------------


def test_a_batch_takes_only_the_room_left_in_the_queue_and_gets_429_per_item_for_the_rest(make_client, redis_url):
    client = make_client(max_queue_depth=5)
    for _ in range(4):
        assert submit(client).status_code == 202

    response = batch(client, [BODY] * 3)

    assert response.status_code == 200
    results = response.json["results"]
    assert [r["status"] for r in results] == [202, 429, 429]
    assert {r["error"]["code"] for r in results[1:]} == {"queue_full"}
    assert response.json["num_accepted"] == 1
    assert JobStore(redis_url).queue_depth() == 5
    assert batch(client, [BODY]).status_code == 429  # nothing fits: the whole batch is refused


def test_one_tenant_at_its_queued_quota_gets_429_while_another_tenant_is_served(make_client):
    client = make_client(tenant_max_queued=2)

    alice = [submit(client).status_code for _ in range(3)]
    alice_batch = batch(client, [BODY])
    bob = batch(client, [BODY, BODY, BODY], tenant="bob")

    assert alice == [202, 202, 429]
    assert alice_batch.status_code == 429 and alice_batch.json["error"]["code"] == "tenant_queue_full"
    assert [r["status"] for r in bob.json["results"]] == [202, 202, 429]


def test_a_tenant_over_its_jobs_per_minute_gets_429_with_retry_after_and_others_are_not_affected(make_client):
    client = make_client(tenant_jobs_per_minute=2)

    statuses = [submit(client) for _ in range(3)]

    assert [r.status_code for r in statuses] == [202, 202, 429]
    assert statuses[2].json["error"]["code"] == "rate_limited"
    assert 1 <= int(statuses[2].headers["Retry-After"]) <= 60
    assert submit(client, tenant="bob").status_code == 202


def test_replays_of_one_idempotency_key_never_use_up_the_tenants_jobs_per_minute(make_client, redis_url):
    """Six POSTs with one Idempotency-Key at STEPWISE_TENANT_JOBS_PER_MINUTE=4 once answered 202, 202, 202, 429,
    429, 429, and the next new job got 429: a replay reserved a slot before the create found the key."""
    client = make_client(tenant_jobs_per_minute=4)

    replays = [submit(client, **{"Idempotency-Key": "same"}) for _ in range(6)]
    batch_replays = [batch(client, [BODY, BODY], **{"Idempotency-Key": "batch"}) for _ in range(3)]
    new_job = submit(client, {**BODY, "seed": 2})
    over = submit(client, {**BODY, "seed": 3})

    assert [r.status_code for r in replays] == [202] * 6
    assert {r.json["job_id"] for r in replays} == {replays[0].json["job_id"]}
    assert all(r.headers["Idempotent-Replayed"] == "true" for r in replays[1:])
    assert [[item["status"] for item in r.json["results"]] for r in batch_replays] == [[202, 202]] * 3
    assert new_job.status_code == 202, new_job.json  # the fourth job this minute
    assert over.status_code == 429 and over.json["error"]["code"] == "rate_limited"
    assert JobStore(redis_url).queue_depth() == 4


def test_every_route_that_creates_jobs_counts_against_the_same_rate_limit(make_client):
    """One submit path: jobs, batch items, OpenAI images and videos take the same tenant's slots."""
    client = make_client(tenant_jobs_per_minute=3, images_wait_seconds=0.1)

    job = submit(client)
    item = batch(client, [BODY])
    video = client.post("/v1/videos", json={"prompt": "a fox", "model": "builtin:tiny-wan"}, headers=auth())
    image = client.post("/v1/images/generations", json={"prompt": "a fox"}, headers=auth())

    assert job.status_code == 202 and item.json["results"][0]["status"] == 202
    assert video.status_code == 200, video.json
    assert image.status_code == 429, image.json
    assert image.json["error"]["code"] == "rate_limited" and "Retry-After" in image.headers


# -- idempotency key spaces -----------------------------------------------------------------


def test_a_single_submit_never_replays_a_batch_item_with_a_look_alike_key(client):
    first = batch(client, [BODY, {**BODY, "seed": 2}], **{"Idempotency-Key": "bk"})
    batch_ids = [r["job"]["job_id"] for r in first.json["results"]]

    single = submit(client, {**BODY, "seed": 2}, **{"Idempotency-Key": "bk#1"})
    replay = batch(client, [BODY, {**BODY, "seed": 2}], **{"Idempotency-Key": "bk"})

    assert single.status_code == 202 and "Idempotent-Replayed" not in single.headers
    assert single.json["job_id"] not in batch_ids
    assert [r["job"]["job_id"] for r in replay.json["results"]] == batch_ids


def many_parts_form(num_parts: int) -> tuple[bytes, str]:
    """A multipart body of `num_parts` one-letter text parts (what a probe sent: 10,000 of them in 0.58 MB)."""
    boundary = "probe-boundary"
    parts = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="f{i}"\r\n\r\na\r\n'.encode() for i in range(num_parts)
    )
    return parts + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize("path", ["/v1/images/edits", "/v1/uploads"])
def test_a_form_of_ten_thousand_tiny_parts_gets_413_naming_the_parts_limit_not_the_body_size(client, path):
    body, content_type = many_parts_form(10_000)
    assert len(body) < 1024 * 1024  # under STEPWISE_MAX_BODY_BYTES: the size was never the reason

    response = client.post(path, data=body, headers={**auth(), "Content-Type": content_type})

    assert response.status_code == 413
    error = response.json["error"]
    message = error["message"]
    assert "more than 100 parts" in message and "STEPWISE_MAX_FORM_PARTS" in message, error
    assert "MAX_BODY_BYTES" not in message
