"""The drain at SIGTERM (worker.drain), decided from measured step times.

The worker's own code (job threads, runtime, drain, real Redis) runs in this process against an engine
whose steps take a known time, so which job fits in the drain does not depend on how busy the machine
is. The same through real worker processes and `stepwise up`: tests/worker/test_recovery.py and
tests/cli/test_up_drain.py.
"""

from __future__ import annotations

import threading

import pytest

from storage.job_record import JobState
from storage.job_store import JobStore
from tests.support.cluster import small_params
from tests.support.waiting import wait_for
from worker import tasks
from worker.runtime import WorkerRuntime

pytestmark = pytest.mark.timeout(60)


def start(runtime: WorkerRuntime, store: JobStore, steps: int) -> tuple[str, list[str], threading.Thread]:
    """A job of `steps` steps, taken and run on a thread of its own as the feeder would."""
    record, _ = store.create(tenant="tests", params=small_params(prompt=f"{steps} steps", num_inference_steps=steps))
    outcome: list[str] = []
    task = threading.Thread(target=lambda: outcome.append(tasks.run_job(runtime)), daemon=True)
    task.start()
    # its record says running a moment before this worker's book holds it: wait for the book
    wait_for(lambda: runtime.held.holds(record.job_id), 10, "this worker to hold the job")
    return record.job_id, outcome, task


def test_sigterm_lets_a_job_that_will_finish_in_time_finish_and_hands_one_that_would_not_back_at_its_next_step(
    paced_runtime, redis_url
):
    store = JobStore(redis_url)
    near_id, near_outcome, near_task = start(paced_runtime, store, steps=12)  # about 2.4 s in all
    far_id, far_outcome, far_task = start(paced_runtime, store, steps=100)  # about 20 s: past the drain
    in_engine = paced_runtime.held.before_or_in_engine
    wait_for(lambda: all(held.step >= 3 for held in in_engine()), 10, "both to measure their pace")

    paced_runtime.begin_shutdown(drain_seconds=8.0)
    far_task.join(10)
    near_task.join(10)

    assert (near_outcome, far_outcome) == (["succeeded"], ["requeued"])
    near, far = store.get(near_id), store.get(far_id)
    assert near.state is JobState.SUCCEEDED and near.attempts == 1
    assert far.state is JobState.QUEUED and far.attempts == 1 and far.requeue_reason == "worker_shutdown"
    assert far.requeued_at < near.finished_at  # handed back at once, not when the drain ran out
    wake_ups = store.redis.llen(store.keys.wake(far.queue))
    assert wake_ups == 3, "two creates and the hand-back woke the queue's workers: any worker takes it next"
    assert paced_runtime.wait_until_idle(0) and not paced_runtime.may_take_jobs()
    store.close()


def test_a_second_signal_hands_back_every_running_job_at_its_next_step(paced_runtime, redis_url):
    store = JobStore(redis_url)
    job_id, outcome, task = start(paced_runtime, store, steps=40)  # about 8 s: it fits in the drain
    [held] = paced_runtime.held.before_or_in_engine()
    wait_for(lambda: held.step >= 3, 10, "the job to measure its pace")
    # a drain it fits in however slowly a busy machine runs its first steps (their pace decides what fits)
    paced_runtime.begin_shutdown(drain_seconds=600.0)
    signaled_at_step = held.step
    wait_for(lambda: held.step >= signaled_at_step + 2, 10, "the job to run on after the first signal")
    assert held.stop_reason is None  # it fits in the drain
    paced_runtime.begin_shutdown(drain_seconds=600.0)
    task.join(10)

    assert outcome == ["requeued"]
    record = store.get(job_id)
    assert record.state is JobState.QUEUED and record.progress_step == 0 and record.requeue_reason == "worker_shutdown"
    store.close()
