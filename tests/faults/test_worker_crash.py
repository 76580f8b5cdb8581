"""Workers that die or race: every job ends `succeeded` exactly once, with one image, and a job whose
wake-up was lost still reaches a worker."""

from __future__ import annotations

import signal
import time

import pytest

from storage.job_record import JobState
from tests.support.cluster import FAST_RECOVERY, small_params
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.workers]

NUM_IN_FLIGHT = 20


def test_a_sigkilled_worker_with_twenty_jobs_in_flight_loses_none_and_runs_none_twice(folder_cluster):
    doomed = folder_cluster.start_worker("doomed", STEPWISE_MAX_NUM_SEQS=str(NUM_IN_FLIGHT), **FAST_RECOVERY)
    job_ids = [
        folder_cluster.submit(small_params(prompt=f"crash survivor {i}", seed=i, num_inference_steps=150))
        for i in range(NUM_IN_FLIGHT)
    ]
    wait_for(
        lambda: folder_cluster.store.counts_by_state()["running"] == NUM_IN_FLIGHT,
        120,
        lambda: f"all {NUM_IN_FLIGHT} jobs to be taken (now {folder_cluster.store.counts_by_state()})",
    )
    folder_cluster.wait_for_progress(job_ids[0], min_step=1)

    doomed.stop(signal.SIGKILL)
    killed_at = time.monotonic()
    folder_cluster.start_worker("rescuer", **FAST_RECOVERY)

    records = [folder_cluster.wait_for_end(job_id) for job_id in job_ids]
    recovered_in = time.monotonic() - killed_at

    assert [r.state for r in records] == [JobState.SUCCEEDED] * NUM_IN_FLIGHT, [r.error_message for r in records]
    assert [r.attempts for r in records] == [2] * NUM_IN_FLIGHT
    assert {r.requeue_reason for r in records} <= {"lease_expired", "worker_lost"}  # the view says why
    assert folder_cluster.store.counts_by_state()["succeeded"] == NUM_IN_FLIGHT  # each reached it once
    assert folder_cluster.store.counts_by_state()["running"] == 0
    assert folder_cluster.stored_images() == sorted(r.image_keys[0] for r in records)
    assert recovered_in < 200, f"recovery took {recovered_in:.0f}s"


def engine_jobs_finished(cluster, worker) -> int:
    return cluster.command(worker, "engine_stats")["jobs_finished"] - 1  # less its warm-up


def test_two_workers_taking_from_one_queue_run_each_job_once_with_one_image(folder_cluster):
    workers = [folder_cluster.start_worker("twin-a"), folder_cluster.start_worker("twin-b")]
    job_ids = [
        folder_cluster.submit(small_params(prompt=f"twin {i}", seed=i, num_inference_steps=20)) for i in range(12)
    ]

    records = [folder_cluster.wait_for_end(job_id) for job_id in job_ids]

    assert [(r.state, r.attempts) for r in records] == [(JobState.SUCCEEDED, 1)] * len(job_ids)
    assert folder_cluster.store.counts_by_state()["succeeded"] == len(job_ids)
    assert folder_cluster.stored_images() == sorted(r.image_keys[0] for r in records)
    assert sum(engine_jobs_finished(folder_cluster, worker) for worker in workers) == len(job_ids)


def test_a_job_whose_wake_up_was_lost_still_reaches_a_worker(folder_cluster):
    record = folder_cluster.create_job(small_params(prompt="no wake-up"))
    folder_cluster.store.redis.delete(folder_cluster.store.keys.wake(record.queue))  # as a Redis restart may lose it

    folder_cluster.start_worker()

    ended = folder_cluster.wait_for_end(record.job_id, timeout=120)
    assert (ended.state, ended.attempts) == (JobState.SUCCEEDED, 1)
