"""HTTP calls the API tests make again and again."""

from __future__ import annotations

import requests

from storage.job_record import TERMINAL_STATE_NAMES
from tests.support.processes import ADMIN_KEYS, TENANT_KEYS, ApiProcess
from tests.support.waiting import wait_for

TERMINAL_STATES = TERMINAL_STATE_NAMES


def auth(tenant: str = "alice") -> dict[str, str]:
    return {"Authorization": f"Bearer {TENANT_KEYS.get(tenant) or ADMIN_KEYS[tenant]}"}


def submit(
    http: requests.Session, api: ApiProcess, body: object, tenant: str = "alice", **headers: str
) -> requests.Response:
    return http.post(f"{api.url}/v1/jobs", json=body, headers={**auth(tenant), **headers}, timeout=10)


def get_job(http: requests.Session, api: ApiProcess, job_id: str, tenant: str = "alice") -> requests.Response:
    return http.get(f"{api.url}/v1/jobs/{job_id}", headers=auth(tenant), timeout=10)


def wait_for_job(
    http: requests.Session,
    api: ApiProcess,
    job_id: str,
    states: set[str],
    *,
    timeout: float = 120.0,
    tenant: str = "alice",
) -> dict:
    """Poll until the job is in one of `states`; fail with its last view after `timeout`, or at once when it
    ends in another state."""
    last: dict = {}

    def in_states() -> dict | None:
        response = get_job(http, api, job_id, tenant)
        assert response.status_code == 200, response.text
        last.update(response.json())
        if last["state"] in states:
            return dict(last)
        if last["state"] in TERMINAL_STATES:
            raise AssertionError(f"job ended {last['state']}, not in {states}: {last}")
        return None

    return wait_for(in_states, timeout, lambda: f"job {job_id} in {states}: {last}")
