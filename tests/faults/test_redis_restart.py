"""Redis restarted (append-only file on) under a running deployment: the API answers 503 while it is
down and recovers by itself, the worker reconnects by itself, and no accepted job is lost or run twice.

`tests/api/test_limits.py::test_while_redis_is_down_the_api_answers_503_and_not_ready` covers every
route's 503 and /readyz; this test adds a worker and jobs queued, running and finishing meanwhile."""

from __future__ import annotations

import time

import pytest
import requests

from storage.job_record import JobState
from tests.support.calls import get_job, submit
from tests.support.processes import ApiProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.workers]

TINY = {"prompt": "a lantern in fog", "height": 64, "width": 64, "guidance_scale": 1.0}
OUTAGE_SECONDS = 6
# The lease outlives the outage: every job must come through on its first attempt, because the
# worker retries its record writes instead of leaving the job to the lease sweeper.
WORKER_ENV = {
    "STEPWISE_JOB_LEASE_SECONDS": "60",
    "STEPWISE_LEASE_SWEEP_INTERVAL": "1",
    "STEPWISE_PROGRESS_INTERVAL": "0.1",
}


def accepted(response: requests.Response) -> requests.Response | None:
    return response if response.status_code == 202 else None


def test_a_redis_restart_loses_no_accepted_job_and_api_and_worker_reconnect_by_themselves(folder_cluster, tmp_path):
    worker = folder_cluster.start_worker(**WORKER_ENV)
    api = ApiProcess(tmp_path / "api", folder_cluster.redis.url, folder_cluster.images.resolve().as_uri()).start()
    http = requests.Session()
    try:
        # Staggered lengths, one more job than the engine runs at once: when Redis goes, one job
        # has ended, others are denoising or about to finish, and one is still queued.
        bodies = [{**TINY, "seed": i, "num_inference_steps": 10 + 20 * i} for i in range(9)]
        job_ids = [submit(http, api, body).json()["job_id"] for body in bodies]
        wait_for(lambda: folder_cluster.store.counts_by_state()["succeeded"] >= 1, 120, "the first job to end")

        folder_cluster.redis.stop()
        refused = [submit(http, api, {**TINY, "seed": 99}), get_job(http, api, job_ids[-1])]
        time.sleep(OUTAGE_SECONDS)
        folder_cluster.redis.start()

        assert [r.status_code for r in refused] == [503, 503], [r.text for r in refused]
        assert all(r.json()["error"]["code"] == "unavailable" for r in refused)
        after = wait_for(
            lambda: accepted(submit(http, api, {**TINY, "seed": 7, "num_inference_steps": 2})),
            30,
            "the API to accept jobs again",
        )
        job_ids.append(after.json()["job_id"])

        records = [folder_cluster.wait_for_end(job_id, timeout=180) for job_id in job_ids]
        assert [(r.state, r.attempts) for r in records] == [(JobState.SUCCEEDED, 1)] * len(job_ids), [
            (r.state.value, r.attempts, r.error_message) for r in records
        ]
        assert folder_cluster.store.counts_by_state()["succeeded"] == len(job_ids)
        images = sorted(str(p.relative_to(folder_cluster.images)) for p in folder_cluster.images.rglob("*.png"))
        assert images == sorted(r.image_keys[0] for r in records)
        assert get_job(http, api, job_ids[0]).json()["state"] == "succeeded"
        assert "RedisUnavailableError" in worker.log_text()  # some record I/O was retried
    finally:
        http.close()
        api.stop()
