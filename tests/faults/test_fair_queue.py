"""The queue's order on a real worker and a real Redis: fair share across tenants, and queue positions
that stay the order jobs are taken in across cancels, a SIGKILLed worker and its job's re-queue.

The worker holds one job at a time, so the order in which jobs start
(`started_at`) is the order the queue handed them out."""

from __future__ import annotations

import contextlib
import signal
import time

import pytest

from storage.errors import InvalidTransitionError
from storage.job_record import JobRecord, JobState
from storage.new_job import NewJobSpec
from storage.queue_names import generate_queue
from tests.support.cluster import FAST_RECOVERY, Cluster, local_folder_cluster, small_params
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.workers]

ONE_AT_A_TIME = {"STEPWISE_MAX_NUM_SEQS": "1", "STEPWISE_WORKER_CONCURRENCY": "1", "OMP_NUM_THREADS": "1"}
QUEUE = generate_queue("builtin:tiny")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    deployment = local_folder_cluster(tmp_path_factory.mktemp("fair-queue"), **FAST_RECOVERY, **ONE_AT_A_TIME)
    deployment.main = deployment.start_worker("fair")
    yield deployment
    deployment.stop_all()
    deployment.redis.stop()


def submit(cluster: Cluster, tenant: str, params_list: list[dict], priority: str = "normal") -> list[str]:
    """Jobs stored together, each waking the worker: what the API does."""
    specs = [NewJobSpec(tenant=tenant, params=params, priority=priority) for params in params_list]
    return [outcome.record.job_id for outcome in cluster.store.create_many(specs)]


def records(cluster: Cluster, job_ids: list[str]) -> list[JobRecord]:
    return [cluster.store.get(job_id) for job_id in job_ids]


def snapshot(cluster: Cluster, job_ids: list[str]) -> dict[str, int]:
    """The reported queue_position of each job queued at one instant. Every job's position is asked for,
    not only those whose record said queued: the records are read one by one before the positions, and a
    job re-queued meanwhile (the victim) would be missing from a snapshot whose positions count it."""
    found = records(cluster, job_ids)
    return {
        record.job_id: position
        for record, position in zip(found, cluster.store.queue_positions(found))
        if position is not None
    }


def test_a_tenants_three_jobs_start_before_most_of_another_tenants_200_job_backlog(cluster):
    backlog = submit(cluster, "bulk", [small_params(prompt=f"bulk {i}", seed=i) for i in range(200)])
    wait_for(lambda: cluster.store.get(backlog[2]).started_at, 120, "the backlog to be under way")

    interactive = submit(cluster, "alice", [small_params(prompt=f"alice {i}", seed=i) for i in range(3)])
    submitted_at = cluster.store.get(interactive[0]).created_at
    ended = [cluster.wait_for_end(job_id) for job_id in interactive]
    for job_id in backlog:  # the rest of the backlog is not this test's business
        if cluster.store.get(job_id).state is JobState.QUEUED:
            with contextlib.suppress(InvalidTransitionError):  # it was taken and ended since it was read
                cluster.store.request_cancel(job_id)

    assert [record.state for record in ended] == [JobState.SUCCEEDED] * 3
    bulk = [record for record in records(cluster, backlog) if record.started_at is not None]
    started_before = sum(record.started_at < submitted_at for record in bulk)
    for index, record in enumerate(ended):
        ahead = sum(other.started_at < record.started_at for other in bulk)
        # The bound: alice's k-th job (from 0) starts after at most k more of bulk's jobs than had started
        # when she submitted, plus one a worker may take with a clock read just before her submit.
        assert ahead <= started_before + index + 1, (index, ahead, started_before)
    assert started_before + 3 < 20, "alice's jobs should start long before the backlog drains"
    wait_for(lambda: cluster.store.counts_by_state()["running"] == 0, 120, "the last bulk job to end")


def test_reported_positions_stay_the_take_order_across_cancels_a_killed_worker_and_a_re_queue(cluster):
    worker = cluster.main
    assert worker.is_alive(), worker.log_tail()
    [victim] = submit(cluster, "bulk", [small_params(prompt="killed mid-run", num_inference_steps=200)])
    cluster.wait_for_progress(victim, min_step=1)  # it holds the worker's only job slot
    waiting = (
        submit(cluster, "bulk", [small_params(prompt=f"bulk {i}", seed=i) for i in range(6)])
        + submit(cluster, "alice", [small_params(prompt=f"alice {i}", seed=i) for i in range(3)])
        + submit(cluster, "bob", [small_params(prompt=f"bob {i}", seed=i) for i in range(2)])
    )
    snapshots = [snapshot(cluster, waiting)]
    canceled = [waiting[1], waiting[7]]
    for job_id in canceled:
        cluster.store.request_cancel(job_id)
    snapshots.append(snapshot(cluster, waiting))
    assert len(snapshots[0]) == len(waiting) and len(snapshots[1]) == len(waiting) - 2, snapshots

    worker.stop(signal.SIGKILL)
    wait_for(lambda: victim in cluster.store.lapsed_job_ids(), 30, "the killed worker's lease to lapse")
    rescuer = cluster.start_worker("rescuer", wait=False)  # its lease sweeper re-queues the victim
    everyone = [victim, *waiting]
    deadline = time.monotonic() + 240
    while not all(record.state.is_terminal for record in records(cluster, everyone)):
        assert time.monotonic() < deadline, [cluster.describe(job_id) for job_id in everyone]
        snapshots.append(snapshot(cluster, everyone))
        time.sleep(0.05)
    cluster.main = rescuer

    final = {record.job_id: record for record in records(cluster, everyone)}
    assert final[victim].state is JobState.SUCCEEDED and final[victim].attempts == 2
    ran = [job_id for job_id in waiting if job_id not in canceled]
    assert all(final[job_id].state is JobState.SUCCEEDED and final[job_id].attempts == 1 for job_id in ran)
    take_order = sorted([victim, *ran], key=lambda job_id: final[job_id].started_at)
    assert take_order[0] == victim, "the re-queued job goes back to the head of the queue"
    assert any(victim in taken for taken in snapshots[2:]), "the re-queued job should have been seen queued"
    for taken in snapshots:
        in_take_order = [job_id for job_id in take_order if job_id in taken]
        expected = sorted(in_take_order, key=lambda job_id: taken[job_id])
        assert in_take_order == expected, "jobs were taken out of their reported order"
        for job_id in in_take_order:  # a position is the number of jobs ahead, less those canceled since
            ahead_canceled = sum(other in canceled and taken[other] < taken[job_id] for other in taken)
            assert in_take_order.index(job_id) == taken[job_id] - ahead_canceled
