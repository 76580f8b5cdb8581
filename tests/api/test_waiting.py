"""`Prefer: wait` and the job event stream, in this process (the Flask app on real Redis, the job moved
by the job store's own transitions from another thread, as a worker would). The SSE client is
httpx-sse over httpx's WSGI transport; the real servers are tests/api/test_live_end_to_end.py's."""

from __future__ import annotations

import dataclasses
import threading
import time

import httpx
import pytest
from httpx_sse import EventSource, ServerSentEvent, connect_sse

from api import create_app
from api.resources import get_settings
from api.waiting import MAX_WAIT_SECONDS, prefer_wait
from storage.api_keys import ApiKeyStore
from storage.job_record import JobState
from storage.job_store import JobStore
from tests.support.calls import auth
from tests.support.job_factories import take_job
from tests.support.waiting import wait_for

JOB = {"prompt": "a lighthouse", "model": "builtin:tiny", "num_inference_steps": 20}


@pytest.fixture
def live_app(app):
    """The conftest app with a short keep-alive, so an idle stream shows one within the test."""
    with app.app_context():
        settings = dataclasses.replace(get_settings(), events_keepalive_seconds=0.3)
    return create_app({"TESTING": True, "API_SETTINGS": settings})


@pytest.fixture
def http_client(live_app):
    with httpx.Client(transport=httpx.WSGITransport(app=live_app), base_url="http://api.test", timeout=30) as client:
        yield client


@pytest.fixture
def store(redis_url):
    with JobStore(redis_url) as job_store:
        yield job_store


def submit(client: httpx.Client, **headers: str) -> httpx.Response:
    return client.post("/v1/jobs", json=JOB, headers={**auth(), **headers})


def later(seconds: float, *steps) -> threading.Thread:
    """Run `steps` (callables) one after another from `seconds` from now, on a thread (as a worker would)."""

    def run() -> None:
        time.sleep(seconds)
        for step in steps:
            step()
            time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def events_of(source: EventSource) -> list[ServerSentEvent]:
    """The stream's events to its end. A keep-alive comment is none: httpx-sse, unlike an EventSource
    (which the SSE spec has drop a block without data), makes an empty unnamed `message` of one that
    follows an event with an id; the stream itself names every event it sends."""
    return [event for event in source.iter_sse() if event.event != "message" or event.data]


def run_to_success(store: JobStore, job_id: str) -> list:
    return [
        lambda: take_job(store, job_id, "worker-1"),
        lambda: store.set_progress(job_id, 5, 20),
        lambda: store.add_preview(job_id, 8, 20, "data:image/webp;base64,UklGRg=="),
        lambda: store.set_progress(job_id, 10, 20),
        lambda: store.finish(job_id, JobState.SUCCEEDED, holder="worker-1#1", image_keys=[f"{job_id}/0.png"]),
    ]


def test_prefer_wait_answers_202_with_location_once_the_wait_runs_out(http_client):
    started = time.monotonic()
    response = submit(http_client, Prefer="wait=1")

    assert response.status_code == 202
    assert time.monotonic() - started >= 1.0
    assert response.headers["Preference-Applied"] == "wait=1"
    assert response.headers["Location"].endswith(f"/v1/jobs/{response.json()['job_id']}")
    assert response.json()["state"] == "queued"


def test_prefer_wait_answers_200_with_the_job_as_soon_as_it_ends(http_client, store):
    def finish_when_created() -> None:  # the job's id is known once it is queued, while the submit waits
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            queued = store.redis.zrange("stepwise:queued", 0, -1)
            if queued:
                for step in run_to_success(store, queued[0]):
                    step()
                return
            time.sleep(0.02)

    threading.Thread(target=finish_when_created, daemon=True).start()
    started = time.monotonic()
    response = submit(http_client, Prefer="respond-async, wait=30")

    assert response.status_code == 200, response.text
    assert time.monotonic() - started < 15
    assert response.json()["state"] == "succeeded"
    assert response.json()["image_url"].endswith("/image")
    assert response.headers["Preference-Applied"] == "wait=30"
    assert "Location" not in response.headers


@pytest.mark.parametrize("value", ["wait=abc", "wait=0", "wait=-3", "wait=1.5"])
def test_a_malformed_wait_preference_is_refused_naming_the_header(http_client, value):
    response = submit(http_client, Prefer=value)

    assert response.status_code == 422
    assert response.json()["error"]["field"] == "Prefer"


def test_wait_preferences_are_read_as_rfc_7240_writes_them():
    assert prefer_wait([]) is None
    assert prefer_wait(["respond-async"]) is None
    assert prefer_wait(["wait"]) == MAX_WAIT_SECONDS
    assert prefer_wait(["respond-async, wait=5"]) == 5
    assert prefer_wait(["return=minimal", "wait = 7"]) == 7
    assert prefer_wait(["wait=600"]) == MAX_WAIT_SECONDS  # longer asks get the longest there is


def test_the_event_stream_sends_the_job_as_it_is_then_each_event_until_its_end(http_client, store):
    job_id = submit(http_client).json()["job_id"]
    with connect_sse(http_client, "GET", f"/v1/jobs/{job_id}/events", headers=auth()) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        later(0.5, *run_to_success(store, job_id))  # connected: its first event, queued, is out
        events = events_of(source)

    assert [event.event for event in events] == ["queued", "started", "progress", "preview", "progress", "succeeded"]
    assert events[0].json() == {"job_id": job_id, "state": "queued", "queue_position": 0}
    assert [event.json()["step"] for event in events if event.event == "progress"] == [5, 10]
    assert events[3].json()["image"].startswith("data:image/webp;base64,")
    ids = [event.id for event in events[1:]]
    assert all(ids) and ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    end = events[-1].json()
    assert end["job_id"] == job_id and end["state"] == "succeeded" and end["image_urls"]


def test_a_stream_resumed_with_last_event_id_gets_only_what_came_after(http_client, store):
    job_id = submit(http_client).json()["job_id"]
    for step in run_to_success(store, job_id)[:3]:  # started, progress 5, preview
        step()
    with connect_sse(http_client, "GET", f"/v1/jobs/{job_id}/events", headers=auth()) as source:
        first = next(event for event in source.iter_sse() if event.event == "progress")
    progress_10, succeed = run_to_success(store, job_id)[3:]
    progress_10()  # while the client is away: the resumed stream must replay it

    resume = {**auth(), "Last-Event-ID": first.id}
    with connect_sse(http_client, "GET", f"/v1/jobs/{job_id}/events", headers=resume) as source:
        # connect_sse returns once the stream's first event is out, so the server read the job's stream
        # before the end (which keeps only itself there) came: no race with the clock of a busy machine.
        later(0.3, succeed)
        resumed = events_of(source)
    with connect_sse(http_client, "GET", f"/v1/jobs/{job_id}/events", headers=resume) as source:
        after_the_end = events_of(source)

    assert first.json()["step"] == 5  # a fresh stream of a running job: started, then its progress
    assert [event.event for event in resumed] == ["progress", "succeeded"]
    assert resumed[0].json()["step"] == 10
    assert [event.event for event in after_the_end] == ["succeeded"]  # only the end is kept after it


def test_a_queued_jobs_stream_follows_its_position_and_an_idle_one_sends_keep_alives(http_client, store):
    ahead = submit(http_client).json()["job_id"]
    job_id = submit(http_client).json()["job_id"]
    # the feed reads positions once a second: the second cancel comes after it has seen the first
    later(1.0, lambda: store.request_cancel(ahead), lambda: time.sleep(2.5), lambda: store.request_cancel(job_id))

    with http_client.stream("GET", f"/v1/jobs/{job_id}/events", headers=auth()) as response:
        raw = b"".join(response.iter_bytes())
    with connect_sse(http_client, "GET", f"/v1/jobs/{job_id}/events", headers=auth()) as source:
        ended = list(source.iter_sse())

    assert b": keep-alive\n\n" in raw  # comment lines, which SSE clients skip
    positions = [line for line in raw.split(b"\n") if line.startswith(b"data:") and b'"queued"' in line]
    assert b'"queue_position":1' in positions[0] and b'"queue_position":0' in positions[-1]
    assert [event.event for event in ended] == ["canceled"]
    assert ended[0].json()["error"]["code"] == "canceled"


def test_another_tenants_job_stream_is_missing_and_a_bad_last_event_id_is_refused(http_client):
    job_id = submit(http_client).json()["job_id"]

    other = http_client.get(f"/v1/jobs/{job_id}/events", headers=auth("bob"))
    bad_id = http_client.get(f"/v1/jobs/{job_id}/events", headers={**auth(), "Last-Event-ID": "yesterday"})
    nobody = http_client.get(f"/v1/jobs/{job_id}/events")

    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
    assert bad_id.status_code == 422 and bad_id.json()["error"]["field"] == "Last-Event-ID"
    assert nobody.status_code == 401


@pytest.mark.parametrize("last_event_id", ["99999999999999999999-0", "1-18446744073709551616"])
def test_a_last_event_id_beyond_what_a_stream_id_can_hold_is_refused_naming_the_header(http_client, last_event_id):
    job_id = submit(http_client).json()["job_id"]

    response = http_client.get(f"/v1/jobs/{job_id}/events", headers={**auth(), "Last-Event-ID": last_event_id})

    assert response.status_code == 422  # was 200 with an empty body: an EventSource would reconnect forever
    assert response.json()["error"]["field"] == "Last-Event-ID"


def test_a_stream_resumed_after_the_largest_stream_id_still_ends_with_the_jobs_end_state(http_client, store):
    job_id = submit(http_client).json()["job_id"]
    store.request_cancel(job_id)

    last = "18446744073709551615-18446744073709551615"  # Redis refuses a range after it: nothing is there
    resume = {**auth(), "Last-Event-ID": last}
    with connect_sse(http_client, "GET", f"/v1/jobs/{job_id}/events", headers=resume) as source:
        events = list(source.iter_sse())

    assert [event.event for event in events] == ["canceled"]
    assert source.response.status_code == 200


@pytest.fixture
def revocable(store, http_client):
    """A key kept in Redis, as `stepwise keys create` makes it, for a tenant of its own: (key, id, its store)."""
    key_store = ApiKeyStore(store.redis, store.keys)
    key, record = key_store.create(f"revocable-{time.monotonic_ns()}")
    wait_for(lambda: http_client.get("/v1/jobs", headers=bearer(key)).status_code == 200, 5, "the new key to work")
    return key, record.key_id, key_store


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_an_event_stream_open_when_its_key_is_revoked_ends_at_once_with_an_error_event(http_client, revocable):
    key, key_id, key_store = revocable
    job_id = http_client.post("/v1/jobs", json=JOB, headers=bearer(key)).json()["job_id"]

    with connect_sse(http_client, "GET", f"/v1/jobs/{job_id}/events", headers=bearer(key)) as source:
        events = (event for event in source.iter_sse() if event.event != "message" or event.data)
        first = next(events)
        key_store.revoke(key_id)
        revoked_at = time.monotonic()
        rest = list(events)  # to the end of the stream
        seconds = time.monotonic() - revoked_at

    assert first.event == "queued"
    assert [event.event for event in rest] == ["error"] and seconds < 1.0, (rest, seconds)
    assert rest[0].json()["error"]["code"] == "unauthorized" and "revoked" in rest[0].json()["error"]["message"]
    # what a reconnecting EventSource gets (after its retry: 2 s) once the API's key table has been read again
    wait_for(
        lambda: http_client.get(f"/v1/jobs/{job_id}/events", headers=bearer(key)).status_code == 401,
        2,
        "the revoked key to be refused",
    )


def test_a_prefer_wait_open_when_its_key_is_revoked_answers_401_at_once(http_client, revocable):
    key, key_id, key_store = revocable
    answers = []
    waiting = threading.Thread(target=lambda: answers.append(submit_as(http_client, key, Prefer="wait=60")))
    waiting.start()
    wait_for(lambda: http_client.get("/v1/jobs", headers=bearer(key)).json()["jobs"], 10, "the waiting submit's job")

    key_store.revoke(key_id)
    revoked_at = time.monotonic()
    waiting.join(timeout=30)
    seconds = time.monotonic() - revoked_at

    (response,) = answers
    assert response.status_code == 401 and seconds < 1.0, (response.text, seconds)
    assert response.json()["error"]["code"] == "unauthorized"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def submit_as(client: httpx.Client, key: str, **headers: str) -> httpx.Response:
    return client.post("/v1/jobs", json=JOB, headers={**bearer(key), **headers})


def test_a_prefer_wait_whose_running_job_is_deleted_meanwhile_answers_404_as_its_get_does(http_client, store):
    before = newest_job_id(http_client)
    answers = []
    waiting = threading.Thread(target=lambda: answers.append(submit(http_client, Prefer="wait=60")))
    waiting.start()
    job_id = wait_for(lambda: (newest := newest_job_id(http_client)) != before and newest, 10, "the submit's job")
    take_job(store, job_id, "worker-1")  # running: its delete writes no end event, only wakes the waiters

    assert http_client.delete(f"/v1/jobs/{job_id}", headers=auth()).status_code == 204
    deleted_at = time.monotonic()
    waiting.join(timeout=30)
    seconds = time.monotonic() - deleted_at

    (response,) = answers
    get = http_client.get(f"/v1/jobs/{job_id}", headers=auth())
    assert response.status_code == get.status_code == 404, response.text  # was 202, a stale view and a Location
    assert response.json() == get.json() and "Location" not in response.headers
    assert seconds < 1.0, seconds


def newest_job_id(client: httpx.Client) -> str | None:
    jobs = client.get("/v1/jobs", headers=auth(), params={"limit": 1}).json()["jobs"]
    return jobs[0]["job_id"] if jobs else None


def test_an_openai_images_call_whose_job_is_deleted_meanwhile_gets_an_openai_shaped_404_saying_so(http_client, store):
    before = newest_job_id(http_client)
    answers = []
    body = {"prompt": "a lighthouse", "model": "builtin:tiny", "size": "64x64"}
    call = threading.Thread(
        target=lambda: answers.append(http_client.post("/v1/images/generations", json=body, headers=auth()))
    )
    call.start()
    job_id = wait_for(lambda: (newest := newest_job_id(http_client)) != before and newest, 10, "the call's job")
    take_job(store, job_id, "worker-1")

    assert http_client.delete(f"/v1/jobs/{job_id}", headers=auth()).status_code == 204
    call.join(timeout=30)

    (response,) = answers
    assert response.status_code == 404, response.text  # was 500 job_lost
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "job_deleted"
    assert error["message"] == f"job {job_id} was deleted while this request waited for it"


def test_an_event_stream_whose_job_is_deleted_ends_with_an_error_event_saying_it_is_gone(http_client, store):
    job_id = submit(http_client).json()["job_id"]
    take_job(store, job_id, "worker-1")

    with connect_sse(http_client, "GET", f"/v1/jobs/{job_id}/events", headers=auth()) as source:
        events = (event for event in source.iter_sse() if event.event != "message" or event.data)
        first = next(events)
        http_client.delete(f"/v1/jobs/{job_id}", headers=auth())
        deleted_at = time.monotonic()
        rest = list(events)
        seconds = time.monotonic() - deleted_at

    assert first.event == "started"
    assert [event.event for event in rest] == ["error"] and seconds < 1.0, (rest, seconds)
    assert rest[0].json()["error"]["code"] == "not_found"


def test_a_job_whose_images_wait_for_storage_says_it_is_storing_and_why_in_its_view_and_its_stream(http_client, store):
    job_id = submit(http_client).json()["job_id"]
    holder = take_job(store, job_id, "worker-1").holder
    store.set_progress(job_id, 20, 20)
    assert store.set_storing(job_id, holder, "S3 upload of s3://b/images/x/0.png failed after 5 attempts")

    view = http_client.get(f"/v1/jobs/{job_id}", headers=auth()).json()
    assert view["state"] == "running" and view["image_urls"] == []
    assert view["storing"]["reason"].startswith("S3 upload of") and view["storing"]["since"]
    with connect_sse(http_client, "GET", f"/v1/jobs/{job_id}/events", headers=auth()) as source:
        later(0.5, lambda: store.finish(job_id, JobState.SUCCEEDED, holder=holder, image_keys=[f"{job_id}/0.png"]))
        events = events_of(source)

    assert [event.event for event in events] == ["started", "progress", "storing", "succeeded"]
    assert events[2].json() == {"job_id": job_id, "reason": view["storing"]["reason"]}
    assert events[-1].json()["storing"] is None and events[-1].json()["state"] == "succeeded"
