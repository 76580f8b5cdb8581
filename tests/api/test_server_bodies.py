"""What the default server (granian, through stepwise_cli.api_rsgi) hands the app: chunked bodies,
bodies over the size limit, percent-encoded paths and the client's address. A real `stepwise api`."""

from __future__ import annotations

import json

import pytest

from tests.support.calls import auth, get_job
from tests.support.pictures import image_bytes

pytestmark = pytest.mark.e2e

MAX_BODY = 4096


@pytest.fixture(scope="module")
def small_body_api(module_redis, storage_url, tmp_path_factory):
    from tests.support.processes import ApiProcess

    server = ApiProcess(
        tmp_path_factory.mktemp("api-bodies"), module_redis.url, storage_url, STEPWISE_MAX_BODY_BYTES=str(MAX_BODY)
    ).start()
    yield server
    server.stop()


def chunked(body: bytes, size: int = 100):
    for start in range(0, len(body), size):
        yield body[start : start + size]


def test_a_chunked_json_body_is_read_whole(small_body_api, http):
    body = json.dumps({"prompt": "a lighthouse at dusk"}).encode()
    response = http.post(
        f"{small_body_api.url}/v1/jobs",
        data=chunked(body, 7),  # requests sends a generator with Transfer-Encoding: chunked
        headers={**auth(), "Content-Type": "application/json"},
        timeout=10,
    )

    assert response.status_code == 202, response.text
    job = get_job(http, small_body_api, response.json()["job_id"]).json()
    assert job["params"]["prompt"] == "a lighthouse at dusk"


@pytest.mark.parametrize("sent_as", ["content-length", "chunked"])
def test_a_body_over_the_limit_gets_413_either_way(small_body_api, http, sent_as):
    body = json.dumps({"prompt": "x" * (2 * MAX_BODY)}).encode()
    response = http.post(
        f"{small_body_api.url}/v1/jobs",
        data=body if sent_as == "content-length" else chunked(body, 1000),
        headers={**auth(), "Content-Type": "application/json"},
        timeout=10,
    )

    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "payload_too_large"


def test_a_percent_encoded_path_reaches_the_route_decoded(small_body_api, http):
    response = http.get(f"{small_body_api.url}/v1/jobs/caf%C3%A9", headers=auth(), timeout=10)

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("sent_as", ["content-length", "chunked", "multipart"])
def test_an_image_upload_over_the_json_body_limit_reaches_its_route(small_body_api, http, sent_as):
    """/v1/uploads has its own limit (10 MiB), above STEPWISE_MAX_BODY_BYTES: the server streams
    such a body to the app instead of refusing it."""
    data = image_bytes(160, 160, seed=3)  # noise: about 75 KiB of PNG, far over MAX_BODY
    assert len(data) > 10 * MAX_BODY
    if sent_as == "multipart":
        kwargs: dict = {"files": {"file": ("noise.png", data, "image/png")}}
    else:
        body = data if sent_as == "content-length" else chunked(data, 5000)
        kwargs = {"data": body, "headers": {"Content-Type": "image/png"}}
    headers = {**auth(), **kwargs.pop("headers", {})}
    response = http.post(f"{small_body_api.url}/v1/uploads", headers=headers, timeout=10, **kwargs)

    assert response.status_code == 201, response.text
    assert response.json()["bytes"] == len(data) and response.json()["width"] == 160


def test_an_oversized_upload_without_a_key_is_refused_unread(small_body_api, http):
    response = http.post(
        f"{small_body_api.url}/v1/uploads",
        data=b"\0" * (20 * MAX_BODY),
        headers={"Content-Type": "image/png"},
        timeout=10,
    )

    assert response.status_code == 401


@pytest.mark.parametrize("key", ["ключ-1".encode(), b"caf\xe9-1"], ids=repr)
def test_an_idempotency_key_beyond_ascii_gets_422_rather_than_vanishing(small_body_api, http, key):
    """granian drops a header value that is not visible ASCII but keeps its name; before, the app saw no key,
    and each retry of a submit queued another job."""
    headers = {**auth(), "Content-Type": "application/json", "Idempotency-Key": key, "X-Note": "ключ".encode()}
    body = json.dumps({"prompt": "a lighthouse at dusk"})

    responses = [http.post(f"{small_body_api.url}/v1/jobs", data=body, headers=headers, timeout=10) for _ in range(2)]

    for response in responses:
        assert response.status_code == 422, response.text
        assert response.json()["error"]["field"] == "Idempotency-Key"
    del headers["Idempotency-Key"]  # another header beyond ASCII is no reason to refuse a request
    assert http.post(f"{small_body_api.url}/v1/jobs", data=body, headers=headers, timeout=10).status_code == 202
