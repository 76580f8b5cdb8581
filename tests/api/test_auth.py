"""API keys: no or bad key gets 401; another tenant's job is 404, never revealed (in-process app)."""

from __future__ import annotations

import pytest

from tests.support.calls import auth

BODY = {"prompt": "a quiet harbor", "seed": 3, "num_inference_steps": 2}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "sk_test_alice"},
        {"Authorization": "Basic sk_test_alice"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer sk_test_alicex"},
        {"Authorization": "Bearer ümlaut"},
    ],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/abc"),
        ("POST", "/v1/jobs/abc/cancel"),
        ("GET", "/v1/jobs/abc/image"),
        ("POST", "/v1/jobs/batch"),
    ],
)
def test_requests_without_a_valid_key_get_401(client, headers, method, path):
    response = client.open(path, method=method, json=BODY, headers=headers)

    assert response.status_code == 401
    assert response.get_json()["error"]["code"] == "unauthorized"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_another_tenants_job_is_not_found(client):
    job = client.post("/v1/jobs", json=BODY, headers=auth("alice")).get_json()

    for method, suffix in [("GET", ""), ("POST", "/cancel"), ("GET", "/image")]:
        response = client.open(f"{job['status_url']}{suffix}", method=method, headers=auth("bob"))
        assert response.status_code == 404, (method, suffix)
    assert client.get(job["status_url"], headers=auth("alice")).get_json()["state"] == "queued"


def test_another_tenants_jobs_are_not_listed(client):
    job = client.post("/v1/jobs", json=BODY, headers=auth("alice")).get_json()

    page = client.get("/v1/jobs", query_string={"limit": 100}, headers=auth("bob")).get_json()

    assert job["job_id"] not in {j["job_id"] for j in page["jobs"]}


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/openapi.json"])
@pytest.mark.e2e
def test_operational_routes_need_no_key(api, http, path):
    assert http.get(f"{api.url}{path}", timeout=10).status_code == 200


@pytest.mark.e2e
def test_metrics_need_an_admin_key(api, http):
    assert http.get(f"{api.url}/metrics", timeout=10).status_code == 401
    forbidden = http.get(f"{api.url}/metrics", headers=auth("alice"), timeout=10)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
    assert http.get(f"{api.url}/metrics", headers=auth("ops"), timeout=10).status_code == 200
