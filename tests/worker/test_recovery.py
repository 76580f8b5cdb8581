"""Workers stopping gracefully: no job is lost and none runs twice to completion. A killed worker's jobs:
tests/faults/test_worker_crash.py (lapsed leases, 20 jobs; a lost wake-up)
and tests/cli/up/test_workers_and_signals.py (default settings: re-queued from the silent heartbeat)."""

from __future__ import annotations

import signal
import time

import pytest

from storage.job_record import JobState
from tests.support.cluster import long_params, small_params

pytestmark = [pytest.mark.timeout(600), pytest.mark.workers]


def test_sigterm_lets_a_running_job_that_fits_in_the_drain_finish_before_the_worker_exits(folder_cluster):
    worker = folder_cluster.start_worker(STEPWISE_DRAIN_SECONDS="400")
    job_id = folder_cluster.submit(long_params(prompt="finish me", num_inference_steps=100))
    folder_cluster.wait_for_progress(job_id, min_step=1)

    assert worker.stop(signal.SIGTERM, timeout=400) == 0, worker.log_tail()

    record = folder_cluster.store.get(job_id)
    assert record.state is JobState.SUCCEEDED and record.attempts == 1


def test_sigterm_hands_back_at_a_step_boundary_what_would_not_finish_in_the_drain_and_another_worker_finishes_it(
    folder_cluster,
):
    first = folder_cluster.start_worker("first", STEPWISE_DRAIN_SECONDS="3")
    long_ids = [folder_cluster.submit(long_params(prompt=f"too long {i}", seed=i)) for i in range(2)]
    short_ids = [folder_cluster.submit(small_params(prompt=f"short {i}")) for i in range(2)]
    for job_id in long_ids:
        folder_cluster.wait_for_progress(job_id, min_step=1)

    signaled_at = time.time()
    assert first.stop(signal.SIGTERM, timeout=60) == 0, first.log_tail()  # exit 0, well before SIGKILL
    for job_id in long_ids:
        requeued = folder_cluster.store.get(job_id)
        assert requeued.state is JobState.QUEUED and requeued.attempts == 1, folder_cluster.describe(job_id)
        assert requeued.requeue_reason == "worker_shutdown" and requeued.requeued_at > signaled_at  # not a lapse

    folder_cluster.start_worker("second")
    for job_id in long_ids:
        finished = folder_cluster.wait_for_end(job_id)
        assert finished.state is JobState.SUCCEEDED and finished.attempts == 2
    assert [folder_cluster.wait_for_end(job_id).state for job_id in short_ids] == [JobState.SUCCEEDED] * 2
    assert folder_cluster.store.counts_by_state()["succeeded"] == 4  # each ended once
