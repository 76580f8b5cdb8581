"""Webhook URLs at submit: the name lookup has a deadline (STEPWISE_WEBHOOK_LOOKUP_TIMEOUT_SECONDS), and a
batch looks each distinct webhook host up once, a few at a time, by one deadline.

Name resolution is faked in-process (`names`): `slow.test` hangs, any other name resolves to 127.0.0.1,
so nothing leaves the machine. The app allows the range 127.0.0.0/8, not a name, so a name is still looked
up and its address checked.
"""

from __future__ import annotations

import threading
import time

import pytest

from api import create_app
from api.settings import ApiSettings, SettingsError
from storage import url_policy
from storage.settings import StorageSettings
from storage.url_policy import AllowList
from tests.support.app_context import get_task_queue_of
from tests.support.calls import auth
from tests.support.names import REFUSED_AMONG, answer
from tests.support.processes import TENANT_KEYS

JOB = {"prompt": "a red fox", "seed": 1, "num_inference_steps": 2}
LOOKUP_SECONDS = 1.0


def app_client(redis_url, tmp_path, webhook_allow: str):
    settings = ApiSettings(
        api_keys=tuple(TENANT_KEYS.items()),
        storage=StorageSettings(redis_url=redis_url, storage_url=(tmp_path / "images").as_uri()),
        webhook_allow=AllowList.parse(webhook_allow),
        webhook_lookup_timeout_seconds=LOOKUP_SECONDS,
        accept_unserved_models=True,
    )
    return create_app({"TESTING": True, "API_SETTINGS": settings})


@pytest.fixture
def hooking_client(redis_url, tmp_path):
    """The app with 127.0.0.0/8 allowed for webhooks (a range: names are looked up) and a 1 s lookup deadline."""
    app = app_client(redis_url, tmp_path, "127.0.0.0/8")
    yield app.test_client()
    get_task_queue_of(app).close()


@pytest.fixture
def strict_client(redis_url, tmp_path):
    """The app with no webhook allow list, as in production."""
    app = app_client(redis_url, tmp_path, "")
    yield app.test_client()
    get_task_queue_of(app).close()


@pytest.fixture
def names(monkeypatch):
    """Faked name resolution: `slow.test` and `slow-*` hang (up to 60 s, released when the test ends), the names
    of `tests.support.names.REFUSED_AMONG` resolve to their addresses, any other name resolves to 127.0.0.1.
    Yields the names looked up, in order."""
    looked_up: list[str] = []
    release = threading.Event()
    real = url_policy.socket.getaddrinfo

    def fake(host, port, *args, **kwargs):
        if host in ("127.0.0.1", "localhost"):  # the app's own Redis connections
            return real(host, port, *args, **kwargs)
        looked_up.append(host)
        if host == "slow.test" or host.startswith("slow-"):
            release.wait(60)
        return answer(REFUSED_AMONG.get(host, ("127.0.0.1",)), port)

    monkeypatch.setattr(url_policy.socket, "getaddrinfo", fake)
    yield looked_up
    release.set()


def test_a_webhook_host_whose_lookup_hangs_gets_a_422_naming_the_field_by_the_deadline(hooking_client, names):
    started = time.monotonic()

    response = hooking_client.post("/v1/jobs", json={**JOB, "webhook_url": "https://slow.test/hooks"}, headers=auth())

    assert response.status_code == 422, response.json
    assert response.json["error"]["field"] == "webhook_url"
    assert "did not resolve within 1s" in response.json["error"]["message"]
    assert time.monotonic() - started < LOOKUP_SECONDS + 5, "the 60 s lookup did not hold the request"


def test_a_batch_looks_each_webhook_host_up_once_and_accepts_every_item(hooking_client, names):
    jobs = [{**JOB, "seed": seed, "webhook_url": f"http://hooks.test:9000/jobs/{seed % 3}"} for seed in range(50)]

    response = hooking_client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth())

    assert response.status_code == 200, response.json
    assert response.json["num_accepted"] == 50, response.json
    assert names.count("hooks.test") == 1, "one host, one lookup, whatever the number of items and paths"


def test_a_batch_with_a_hanging_webhook_host_answers_by_about_one_deadline_each_item_naming_its_field(
    hooking_client, names
):
    jobs = [{**JOB, "seed": seed, "webhook_url": f"http://slow.test/hooks/{seed}"} for seed in range(20)]
    jobs.append({**JOB, "webhook_url": "http://hooks.test/hooks"})  # a host that answers: unaffected
    jobs.append(JOB)  # no webhook
    started = time.monotonic()

    response = hooking_client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth())

    assert response.status_code == 200, response.json
    results = response.json["results"]
    assert [result["status"] for result in results] == [422] * 20 + [202, 202], response.json
    fields = [result["error"]["field"] for result in results[:20]]
    assert fields == [f"jobs[{index}].webhook_url" for index in range(20)]
    assert "did not resolve within 1s" in results[0]["error"]["message"]
    assert names.count("slow.test") == 1
    assert time.monotonic() - started < LOOKUP_SECONDS + 5, "20 items of one hanging host cost one deadline"


def test_a_batch_of_many_hanging_webhook_hosts_holds_at_most_a_few_lookup_threads(hooking_client, names):
    """Lookups the resolver never answers keep their pool threads past the deadline: one request starts
    at most LOOKUPS_PER_REQUEST of them, so it cannot take every thread from other requests."""
    jobs = [{**JOB, "seed": seed, "webhook_url": f"http://slow-{seed}.test/hooks"} for seed in range(12)]
    started = time.monotonic()

    response = hooking_client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth())

    assert response.status_code == 200, response.json
    results = response.json["results"]
    assert [result["status"] for result in results] == [422] * 12, response.json
    assert all("did not resolve within 1s" in result["error"]["message"] for result in results)
    assert len(names) == url_policy.LOOKUPS_PER_REQUEST, names
    assert time.monotonic() - started < LOOKUP_SECONDS + 5


def test_a_batch_of_many_webhook_hosts_that_answer_looks_each_up_and_accepts_every_item(hooking_client, names):
    """More distinct hosts than run at once: each starts when an earlier one is answered."""
    jobs = [{**JOB, "seed": seed, "webhook_url": f"http://hooks-{seed}.test/hooks"} for seed in range(20)]

    response = hooking_client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth())

    assert response.status_code == 200, response.json
    assert response.json["num_accepted"] == 20, response.json
    assert sorted(names) == sorted(f"hooks-{seed}.test" for seed in range(20))


def test_a_batch_refuses_webhook_names_that_resolve_to_loopback_unless_allowed(strict_client, names):
    jobs = [
        {**JOB, "webhook_url": "http://hooks.test/a"},
        {**JOB, "webhook_url": "http://127.0.0.1:9/b"},
        {**JOB, "webhook_url": "ftp://hooks.test/c"},
        JOB,
    ]

    response = strict_client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth())

    assert response.status_code == 200, response.json
    results = response.json["results"]
    assert [result["status"] for result in results] == [422, 422, 422, 202], response.json
    assert [result["error"]["field"] for result in results[:3]] == [f"jobs[{index}].webhook_url" for index in range(3)]
    assert "resolves to 127.0.0.1" in results[0]["error"]["message"]
    assert "must use http or https" in results[2]["error"]["message"]


def test_a_single_submit_refuses_a_webhook_name_that_resolves_to_loopback(strict_client, names):
    response = strict_client.post("/v1/jobs", json={**JOB, "webhook_url": "https://hooks.test/x"}, headers=auth())

    assert response.status_code == 422, response.json
    assert response.json["error"]["field"] == "webhook_url"
    assert "resolves to 127.0.0.1" in response.json["error"]["message"]


@pytest.fixture
def one_address_client(redis_url, tmp_path):
    """The app allowing webhooks to 127.0.0.1 only (a range of one address: names are looked up and checked)."""
    app = app_client(redis_url, tmp_path, "127.0.0.1")
    yield app.test_client()
    get_task_queue_of(app).close()


@pytest.mark.parametrize("name", sorted(REFUSED_AMONG))
def test_a_single_submit_refuses_a_webhook_name_with_one_refused_address_wherever_it_stands(
    one_address_client, names, name
):
    response = one_address_client.post("/v1/jobs", json={**JOB, "webhook_url": f"http://{name}/x"}, headers=auth())

    assert response.status_code == 422, response.json
    assert response.json["error"]["field"] == "webhook_url"
    assert "resolves to 127.0.0.2" in response.json["error"]["message"]


def test_a_batch_refuses_each_webhook_name_with_one_refused_address_and_accepts_one_with_none(
    one_address_client, names
):
    hosts = [*sorted(REFUSED_AMONG), "allowed.test"]  # allowed.test resolves to 127.0.0.1 alone
    jobs = [{**JOB, "webhook_url": f"http://{host}/x"} for host in hosts]

    response = one_address_client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth())

    results = response.json["results"]
    assert [result["status"] for result in results] == [422, 422, 422, 202], response.json
    assert all("resolves to 127.0.0.2" in result["error"]["message"] for result in results[:3])


def test_a_lookup_deadline_of_zero_is_refused_at_start(monkeypatch):
    monkeypatch.setenv("STEPWISE_API_KEYS", "t:k")
    monkeypatch.setenv("STEPWISE_WEBHOOK_LOOKUP_TIMEOUT_SECONDS", "0")

    with pytest.raises(SettingsError, match="STEPWISE_WEBHOOK_LOOKUP_TIMEOUT_SECONDS"):
        ApiSettings.from_env()
