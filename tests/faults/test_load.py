"""Load: thousands of tiny jobs submitted as fast as the API takes them all reach an end state,
and the worker's memory after the run is what it was before (no per-job leak).

`STEPWISE_LOAD_JOBS` sets the count (default 2000). Memory is the worker process's RSS, read
after a warm-up batch (model, buffers, allocator pools and Python's caches settle there) and
again after the run; the margin is `RSS_MARGIN_MB`.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests

from settings import read
from tests.support.calls import auth
from tests.support.processes import ApiProcess
from tests.support.waiting import wait_for

NUM_JOBS = read("STEPWISE_LOAD_JOBS")
# The allocator and caches settle over the first several hundred jobs: after a 200-job warm-up, 2,000 jobs grew
# the worker 33-60 MB and 6,000 grew 47 MB (not per job); after 1,000, 2,000 jobs grew it 2-14 MB.
NUM_WARM_UP = 1000
BATCH_SIZE = 100  # STEPWISE_MAX_BATCH_JOBS' default
RSS_MARGIN_MB = 50
TINY = {"prompt": "a tiny fox", "height": 64, "width": 64, "guidance_scale": 1.0}

pytestmark = [pytest.mark.timeout(600), pytest.mark.workers]


def submit_all(api: ApiProcess, num_jobs: int, first_seed: int) -> list[str]:
    """POST /v1/jobs/batch from 4 clients at once; returns the accepted job ids."""

    def post(start: int) -> list[str]:
        jobs = [
            {**TINY, "seed": seed, "num_inference_steps": 1 + seed % 2}
            for seed in range(start, min(start + BATCH_SIZE, first_seed + num_jobs))
        ]
        response = requests.post(f"{api.url}/v1/jobs/batch", json={"jobs": jobs}, headers=auth(), timeout=60)
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["status"] for r in results] == [202] * len(jobs), results
        return [r["job"]["job_id"] for r in results]

    with ThreadPoolExecutor(4) as pool:
        batches = pool.map(post, range(first_seed, first_seed + num_jobs, BATCH_SIZE))
        return [job_id for batch in batches for job_id in batch]


def wait_until_all_ended(cluster, num_ended: int, timeout: float) -> dict[str, int]:
    def counts() -> dict[str, int] | None:
        by_state = cluster.store.counts_by_state()
        ended = sum(n for state, n in by_state.items() if state not in ("queued", "running"))
        return by_state if ended >= num_ended else None

    return wait_for(
        counts, timeout, lambda: f"{num_ended} jobs to end (now {cluster.store.counts_by_state()})", interval=1.0
    )


def test_thousands_of_tiny_jobs_all_end_and_the_worker_does_not_grow(folder_cluster, tmp_path):
    worker = folder_cluster.start_worker(STEPWISE_MAX_NUM_SEQS="16", STEPWISE_PROGRESS_INTERVAL="0.5")
    api = ApiProcess(tmp_path / "api", folder_cluster.redis.url, folder_cluster.images.resolve().as_uri()).start()
    memory = psutil.Process(worker.process.pid)
    try:
        submit_all(api, NUM_WARM_UP, first_seed=0)
        wait_until_all_ended(folder_cluster, NUM_WARM_UP, timeout=300)
        rss_before = memory.memory_info().rss

        started = time.monotonic()
        job_ids = submit_all(api, NUM_JOBS, first_seed=NUM_WARM_UP)
        submitted_in = time.monotonic() - started
        counts = wait_until_all_ended(folder_cluster, NUM_WARM_UP + NUM_JOBS, timeout=540)
        ran_in = time.monotonic() - started
        rss_after = memory.memory_info().rss
    finally:
        api.stop()

    grew_mb = (rss_after - rss_before) / 2**20
    print(
        f"\n{NUM_JOBS} jobs: submitted in {submitted_in:.1f}s ({NUM_JOBS / submitted_in:.0f}/s), all ended after "
        f"{ran_in:.1f}s ({NUM_JOBS / ran_in:.1f} jobs/s); worker RSS {rss_before / 2**20:.0f} MB -> "
        f"{rss_after / 2**20:.0f} MB ({grew_mb:+.1f} MB)"
    )
    assert len(set(job_ids)) == NUM_JOBS
    assert counts["succeeded"] == NUM_WARM_UP + NUM_JOBS, counts
    assert grew_mb < RSS_MARGIN_MB, f"the worker grew by {grew_mb:.0f} MB over {NUM_JOBS} jobs"
    assert worker.is_alive()
