"""A revoked API key ends what it opened: over real HTTP against `stepwise api` (granian, where waits and
streams run on the event loop: storage.job_event_feed), with no worker, so every job stays queued and
every wait stays open until the key is revoked. Keys are made as `stepwise keys create` makes them. The
same in process (the same coroutines, each on an event loop of its own: api.live_wsgi) is in
tests/api/test_waiting.py."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
from httpx_sse import connect_sse

from storage.api_keys import ApiKeyStore
from storage.job_store import JobStore
from tests.support.processes import ApiProcess
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

JOB = {"prompt": "a lighthouse", "model": "builtin:tiny"}
PROMPT_SECONDS = 1.0  # how soon after its revocation an open request must end (issue 35)


@pytest.fixture(scope="module")
def waiting_api(module_redis, storage_url, tmp_path_factory):
    """`stepwise api` whose OpenAI images calls wait a minute (no worker: they wait until something ends them)."""
    server = ApiProcess(
        tmp_path_factory.mktemp("revocation-api"), module_redis.url, storage_url, STEPWISE_IMAGES_WAIT_SECONDS="60"
    ).start()
    yield server
    server.stop()


@pytest.fixture
def http():
    with httpx.Client(timeout=90) as client:
        yield client


@pytest.fixture
def revocable(module_redis, waiting_api, http):
    """A key kept in Redis for a tenant of its own, once the API takes it: (key, its id, the key store)."""
    with JobStore(module_redis.url) as store:
        key_store = ApiKeyStore(store.redis, store.keys)
        key, record = key_store.create(f"revocable-{time.monotonic_ns()}")
        wait_for(lambda: jobs_of(http, waiting_api, key) is not None, 10, "the new key to work")
        yield key, record.key_id, key_store


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def jobs_of(http: httpx.Client, api: ApiProcess, key: str) -> list | None:
    response = http.get(f"{api.url}/v1/jobs", headers=bearer(key))
    return response.json()["jobs"] if response.status_code == 200 else None


def revoke_once_waiting(
    http: httpx.Client, api: ApiProcess, key: str, key_id: str, key_store: ApiKeyStore, errors: list | None = None
) -> float:
    """Revoke the key once the request waiting in another thread has made its job; returns when (monotonic).
    `errors`: what that request raised so far, said if its job never comes."""
    wait_for(lambda: jobs_of(http, api, key), 30, lambda: f"the waiting request's job (its errors: {errors})")
    key_store.revoke(key_id)
    return time.monotonic()


def test_an_open_event_stream_ends_with_an_error_event_within_a_second_of_its_keys_revocation(
    waiting_api, http, revocable
):
    key, key_id, key_store = revocable
    job_id = http.post(f"{waiting_api.url}/v1/jobs", json=JOB, headers=bearer(key)).json()["job_id"]

    with connect_sse(http, "GET", f"{waiting_api.url}/v1/jobs/{job_id}/events", headers=bearer(key)) as source:
        events = source.iter_sse()
        first = next(events)
        key_store.revoke(key_id)
        revoked_at = time.monotonic()
        rest = [event for event in events if event.event != "message" or event.data]  # to the stream's end
        seconds = time.monotonic() - revoked_at

    assert first.event == "queued"
    assert [event.event for event in rest] == ["error"] and seconds < PROMPT_SECONDS, (rest, seconds)
    error = rest[0].json()["error"]
    assert error["code"] == "unauthorized" and "revoked" in error["message"]


def test_an_open_prefer_wait_answers_401_within_a_second_of_its_keys_revocation(waiting_api, http, revocable):
    key, key_id, key_store = revocable
    answers: list[httpx.Response] = []
    submit = threading.Thread(
        target=lambda: answers.append(
            http.post(f"{waiting_api.url}/v1/jobs", json=JOB, headers={**bearer(key), "Prefer": "wait=60"})
        )
    )
    submit.start()
    revoked_at = revoke_once_waiting(http, waiting_api, key, key_id, key_store)
    submit.join(timeout=90)
    seconds = time.monotonic() - revoked_at

    (response,) = answers
    assert response.status_code == 401 and seconds < PROMPT_SECONDS, (response.text, seconds)
    assert response.json()["error"]["code"] == "unauthorized"


def test_an_open_openai_images_call_fails_authentication_within_a_second_of_its_keys_revocation(
    waiting_api, http, revocable
):
    key, key_id, key_store = revocable
    client = openai.OpenAI(api_key=key, base_url=f"{waiting_api.url}/v1", max_retries=0, timeout=90)
    errors: list[Exception] = []

    def generate() -> None:
        try:
            client.images.generate(model="builtin:tiny", prompt="a lighthouse", size="64x64")
        except openai.APIError as e:
            errors.append(e)

    call = threading.Thread(target=generate)
    call.start()
    revoked_at = revoke_once_waiting(http, waiting_api, key, key_id, key_store, errors)
    call.join(timeout=90)
    seconds = time.monotonic() - revoked_at

    (error,) = errors
    assert isinstance(error, openai.AuthenticationError) and seconds < PROMPT_SECONDS, (error, seconds)
    assert error.body["code"] == "invalid_api_key" and "revoked" in error.body["message"]
