"""Backpressure and size limits: 429 with Retry-After over the queue limit, 413 over the body limit,
503 (never 500) while Redis is down."""

from __future__ import annotations

import pytest

from tests.support.calls import auth, submit
from tests.support.processes import ApiProcess

pytestmark = pytest.mark.e2e

BODY = {"prompt": "a paper boat", "seed": 1, "num_inference_steps": 2}
MAX_QUEUE_DEPTH = 3


@pytest.fixture(scope="module")
def limited_api(module_redis, storage_url, tmp_path_factory):
    server = ApiProcess(
        tmp_path_factory.mktemp("limited-api"),
        module_redis.url,
        storage_url,
        STEPWISE_MAX_QUEUE_DEPTH=str(MAX_QUEUE_DEPTH),
        STEPWISE_MAX_BODY_BYTES="4096",
        STEPWISE_MAX_BATCH_JOBS="2",
    ).start()
    yield server
    server.stop()


def test_a_full_queue_answers_429_with_retry_after_until_a_job_leaves_it(limited_api, http):
    accepted = [submit(http, limited_api, BODY) for _ in range(MAX_QUEUE_DEPTH)]
    assert [r.status_code for r in accepted] == [202] * MAX_QUEUE_DEPTH

    refused = submit(http, limited_api, BODY)
    batch = http.post(f"{limited_api.url}/v1/jobs/batch", json={"jobs": [BODY]}, headers=auth(), timeout=10)

    assert refused.status_code == 429 and batch.status_code == 429
    assert refused.json()["error"]["code"] == "queue_full"
    assert int(refused.headers["Retry-After"]) > 0

    http.post(accepted[0].json()["cancel_url"], headers=auth(), timeout=10)
    assert submit(http, limited_api, BODY).status_code == 202


def test_the_body_limit_is_configurable(limited_api, http):
    response = submit(http, limited_api, {**BODY, "prompt": "x" * 5000})

    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


def test_the_batch_limit_is_configurable_and_documented(limited_api, http):
    response = http.post(f"{limited_api.url}/v1/jobs/batch", json={"jobs": [BODY] * 3}, headers=auth(), timeout=10)
    document = http.get(f"{limited_api.url}/openapi.json", timeout=10).json()

    assert response.status_code == 422 and response.json()["error"]["field"] == "jobs"
    assert document["components"]["schemas"]["BatchRequest"]["properties"]["jobs"]["maxItems"] == 2


def test_while_redis_is_down_the_api_answers_503_and_not_ready(own_redis, storage_url, tmp_path, http):
    api = ApiProcess(tmp_path, own_redis.url, storage_url).start()
    try:
        job = submit(http, api, BODY).json()
        own_redis.stop()

        responses = [
            submit(http, api, BODY),
            http.get(job["status_url"], headers=auth(), timeout=10),
            http.get(f"{api.url}/v1/jobs", headers=auth(), timeout=10),
            http.post(job["cancel_url"], headers=auth(), timeout=10),
        ]
        ready = http.get(f"{api.url}/readyz", timeout=10)
        alive = http.get(f"{api.url}/healthz", timeout=10)
        metrics = http.get(f"{api.url}/metrics", headers=auth("ops"), timeout=10)  # an environment key: no Redis

        assert [r.status_code for r in responses] == [503] * len(responses)
        assert all(r.json()["error"]["code"] == "unavailable" for r in responses)
        assert ready.status_code == 503 and ready.json()["checks"]["redis"] is False
        assert alive.status_code == 200
        assert metrics.status_code == 200 and "stepwise_redis_up 0.0" in metrics.text

        own_redis.start()
        assert http.get(f"{api.url}/readyz", timeout=10).status_code == 200
        assert http.get(job["status_url"], headers=auth(), timeout=10).status_code == 200
    finally:
        api.stop()
