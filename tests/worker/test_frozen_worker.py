"""A worker frozen while its job runs (SIGSTOP, then SIGCONT: what a long GC pause, a stalled driver call holding
the GIL or a VM stall look like), long enough for another process to re-queue the job behind its back: the job
still ends once, succeeded, with one set of images, never failed.

Another process re-queues it one of two ways: its dead-worker watch, once the frozen worker's heartbeat stayed
unchanged for `STEPWISE_WORKER_TIMEOUT` (10 s), or its lease sweeper, once the job's lease lapsed (a lapse the
frozen worker notices late). The resumed worker's feeder may then take the job again itself: the held-jobs book
(`worker.held_jobs`) has the re-taken attempt join the one still running, and each write carries the attempt's
holder token (`worker_id#attempt`), so the stale attempt can neither end the job nor run it a second time.

Real processes: an engine worker (builtin:tiny, 3 s leases) shared by the tests, and per test a webhook-only worker
that runs the watch (a dead-worker watch that never sweeps leases, or a lease sweeper that never judges a worker
dead), so each test exercises one way."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from storage.job_record import JobRecord, JobState
from tests.support.cluster import Cluster, local_folder_cluster, long_params
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(600), pytest.mark.workers]

WORKER_TIMEOUT = 10.0  # the dead-worker watch's, as by default
LEASE_SECONDS = 3  # the engine worker's leases: a freeze of a few seconds lets one lapse
NEVER = "3600"


@pytest.fixture(scope="module")
def frozen_cluster(tmp_path_factory) -> Iterator[Cluster]:
    """Own Redis, a local image folder, and one engine worker (`frozen_cluster.main`) that the tests freeze."""
    cluster = local_folder_cluster(
        tmp_path_factory.mktemp("frozen-worker"), STEPWISE_JOB_LEASE_SECONDS=str(LEASE_SECONDS)
    )
    try:
        cluster.main = cluster.start_worker("frozen", queues="stepwise.generate")
        yield cluster
    finally:
        cluster.stop_all()
        cluster.redis.stop()


def start_watch(cluster: Cluster, label: str, **env: str) -> WorkerProcess:
    """A webhook-only worker: it runs no engine, but a dead-worker watch and a lease sweeper, as every worker does."""
    return cluster.start_worker(label, queues="stepwise.webhooks", wait=True, **env)


def freeze_until_requeued(cluster: Cluster, worker: WorkerProcess, job_id: str, at_least: float) -> JobRecord:
    """SIGSTOP the worker while `job_id` runs; SIGCONT it once another process re-queued the job and `at_least`
    seconds passed. Returns the record as it was just before the worker went on."""
    running = cluster.wait_for_progress(job_id, min_step=2)
    assert running.attempts == 1
    assert worker.process is not None
    frozen_at = time.monotonic()
    os.killpg(worker.process.pid, signal.SIGSTOP)
    try:
        requeued = wait_for(
            lambda: _requeued(cluster, job_id), 120, lambda: f"the job to be re-queued ({cluster.describe(job_id)})"
        )
        time.sleep(max(0.0, at_least - (time.monotonic() - frozen_at)))
        before = cluster.store.get(job_id)
    finally:
        os.killpg(worker.process.pid, signal.SIGCONT)
    assert before is not None and requeued is not None
    return before


def _requeued(cluster: Cluster, job_id: str) -> JobRecord | None:
    record = cluster.store.get(job_id)
    return record if record is not None and record.requeue_reason is not None else None


def assert_ended_once_with_one_set_of_images(cluster: Cluster, job_id: str, counts_before: dict[str, int]) -> None:
    ended = cluster.wait_for_end(job_id)
    assert (ended.state, ended.error_code, ended.error_message) == (JobState.SUCCEEDED, None, None), ended.error_message
    assert ended.attempts == 2  # taken again after the re-queue (joined or run again), never run beside itself
    assert ended.image_keys == [f"{job_id}/0.png", f"{job_id}/1.png"]
    stored = sorted(str(path.relative_to(cluster.images)) for path in (cluster.images / job_id).glob("*.png"))
    assert stored == ended.image_keys
    counts = cluster.store.counts_by_state()
    assert counts["succeeded"] - counts_before["succeeded"] == 1
    assert counts["failed"] == counts_before["failed"]  # terminal states are final: never failed on the way
    log = cluster.main.log_text()
    assert "already used by an unfinished job" not in log and "invalid_params" not in log


@pytest.mark.parametrize("seconds", [13, 17])
def test_a_worker_frozen_past_the_dead_worker_timeout_still_ends_its_job_once_succeeded(frozen_cluster, seconds):
    watch = start_watch(frozen_cluster, f"dead-watch-{seconds}", STEPWISE_LEASE_SWEEP_INTERVAL=NEVER)
    try:
        counts = frozen_cluster.store.counts_by_state()
        job_id = frozen_cluster.submit(long_params(prompt=f"frozen {seconds}s", num_inference_steps=60, num_images=2))

        before = freeze_until_requeued(frozen_cluster, frozen_cluster.main, job_id, at_least=seconds)

        assert before.requeue_reason == "worker_lost", before
        assert_ended_once_with_one_set_of_images(frozen_cluster, job_id, counts)
    finally:
        watch.kill()


def test_a_lease_that_lapsed_while_the_worker_was_frozen_still_ends_its_job_once_succeeded(frozen_cluster):
    watch = start_watch(
        frozen_cluster, "lease-watch", STEPWISE_WORKER_TIMEOUT=NEVER, STEPWISE_LEASE_SWEEP_INTERVAL="0.5"
    )
    try:
        counts = frozen_cluster.store.counts_by_state()
        job_id = frozen_cluster.submit(long_params(prompt="lease lapsed", num_inference_steps=60, num_images=2))

        before = freeze_until_requeued(frozen_cluster, frozen_cluster.main, job_id, at_least=2 * LEASE_SECONDS)

        assert before.requeue_reason == "lease_expired", before
        assert_ended_once_with_one_set_of_images(frozen_cluster, job_id, counts)
    finally:
        watch.kill()
