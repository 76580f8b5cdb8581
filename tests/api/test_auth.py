"""API keys: no or bad key gets 401; another tenant's job is 404, never revealed."""

from __future__ import annotations

import pytest

from tests.api.calls import auth, submit

BODY = {"prompt": "a quiet harbor", "seed": 3, "num_inference_steps": 2}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "sk_test_alice"},
                                     {"Authorization": "Basic sk_test_alice"}, {"Authorization": "Bearer "},
                                     {"Authorization": "Bearer sk_test_alicex"}, {"Authorization": "Bearer ümlaut"}])
@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/jobs"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/abc"),
                                              ("POST", "/v1/jobs/abc/cancel"), ("GET", "/v1/jobs/abc/image"),
                                              ("POST", "/v1/jobs/batch")])
def test_requests_without_a_valid_key_get_401(api, http, headers, method, path):
    response = http.request(method, f"{api.url}{path}", json=BODY, headers=headers, timeout=10)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_another_tenants_job_is_not_found(api, http):
    job = submit(http, api, BODY, "alice").json()

    for method, suffix in [("GET", ""), ("POST", "/cancel"), ("GET", "/image")]:
        response = http.request(method, f"{job['status_url']}{suffix}", headers=auth("bob"), timeout=10)
        assert response.status_code == 404, (method, suffix)
    assert http.get(job["status_url"], headers=auth("alice"), timeout=10).json()["state"] == "queued"


def test_another_tenants_jobs_are_not_listed(api, http):
    job = submit(http, api, BODY, "alice").json()

    page = http.get(f"{api.url}/v1/jobs", params={"limit": 100}, headers=auth("bob"), timeout=10).json()

    assert job["job_id"] not in {j["job_id"] for j in page["jobs"]}


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/openapi.json"])
def test_operational_routes_need_no_key(api, http, path):
    assert http.get(f"{api.url}{path}", timeout=10).status_code == 200
