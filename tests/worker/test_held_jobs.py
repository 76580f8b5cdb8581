"""The held-jobs book (worker.held_jobs): one take, one let-go, and what a take of a job already held here does.

The book alone, then a real runtime in this process (real Redis, an engine whose steps take a known time) whose job
is re-queued behind its back and taken again by the same worker, as after a freeze past the dead-worker timeout.
With real processes and SIGSTOP: tests/worker/test_frozen_worker.py."""

from __future__ import annotations

import threading
import time

import pytest

from storage.job_record import JobRecord, JobState
from storage.job_store import JobStore
from tests.support.cluster import small_params
from tests.support.job_factories import FakeClock, take_job
from tests.support.waiting import wait_for
from worker.held_job import Stage, StopReason
from worker.held_jobs import HeldJobs
from worker.tasks import run_held_job, run_job

pytestmark = pytest.mark.timeout(60)


def attempt(job_id: str, number: int, worker_id: str = "w") -> JobRecord:
    return JobRecord(job_id, "tests", JobState.RUNNING, {}, 0.0, "q", worker_id=worker_id, attempts=number)


def test_a_job_taken_again_while_its_attempt_runs_here_joins_it():
    book = HeldJobs()
    first = book.take(attempt("job", 1))
    assert first is not None
    first.stage = Stage.IN_ENGINE

    assert book.take(attempt("job", 2)) is None  # no second thread, no second engine run

    assert book.all() == [first] and (first.attempt, first.holder) == (2, "w#2")
    assert book.holders() == [("job", "w#2")]  # the lease keeper renews the new attempt
    assert book.lose("job", "w#1") is None and first.stop_reason is None  # the old token's refusal is stale


def test_a_job_taken_again_after_its_attempt_here_was_told_it_lost_waits_for_that_attempt_to_go():
    book = HeldJobs()
    first = book.take(attempt("job", 1))
    assert book.lose("job", "w#1") is first and first.stop_reason is StopReason.LEASE_LOST

    second = book.take(attempt("job", 2))

    assert second is not None and second is not first and second.predecessor is first
    waiting = threading.Thread(target=book.wait_for_predecessor, args=(second,))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive(), "it waits while the stale attempt still runs in the engine"
    book.let_go(first)
    waiting.join(5)
    assert not waiting.is_alive() and book.all() == [second]  # the stale attempt's let-go leaves the new one held


def test_a_job_taken_again_while_its_attempt_here_writes_its_way_out_does_not_join_it():
    """The ending attempt writes with its own token, which Redis refuses now: joining it would lose the job."""
    book = HeldJobs()
    first = book.take(attempt("job", 1))
    assert first is not None
    book.begin_ending(first)

    second = book.take(attempt("job", 2))

    assert second is not None and second.predecessor is first and first.holder == "w#1"


def test_a_job_re_queued_behind_its_running_workers_back_and_taken_again_there_succeeds_once(paced_runtime, redis_url):
    store = JobStore(redis_url)
    record, _ = store.create(tenant="tests", params=small_params(num_inference_steps=25))  # about 5 s
    taken = take_job(store, record.job_id, paced_runtime.worker_id)
    held = paced_runtime.held.take(taken)
    assert held is not None
    outcome: list[str] = []
    thread = threading.Thread(target=lambda: outcome.append(run_held_job(paced_runtime, held, taken)), daemon=True)
    thread.start()
    wait_for(lambda: held.step >= 2, 10, "the job to run")

    assert store.release(record.job_id, taken.holder, "worker_lost", "judged dead while frozen")  # another process
    again = take_job(store, record.job_id, paced_runtime.worker_id)  # this worker's feeder, once it runs again
    assert paced_runtime.held.take(again) is None  # joined: nothing new starts
    thread.join(20)

    assert outcome == ["succeeded"]
    ended = store.get(record.job_id)
    assert (ended.state, ended.attempts, ended.requeue_reason) == (JobState.SUCCEEDED, 2, "worker_lost")
    assert ended.image_keys == [f"{record.job_id}/0.png"] and not paced_runtime.held.holds(record.job_id)
    store.close()


def test_timings_start_is_this_attempts_from_its_take_not_from_the_first_attempts(paced_runtime, redis_url):
    """A job first taken an hour ago by a worker that died, re-queued, and run here: its `start` (take to engine)
    counts this attempt only."""
    an_hour_ago = FakeClock(time.time() - 3600)
    with JobStore(redis_url, clock=an_hour_ago) as then:
        record, _ = then.create(tenant="tests", params=small_params(num_inference_steps=2))
        first = take_job(then, record.job_id, "a-worker-that-died")
        assert then.release(record.job_id, first.holder, "worker_lost", "it died")

    assert run_job(paced_runtime) == "succeeded"

    with JobStore(redis_url) as store:
        ended = store.get(record.job_id)
    assert ended.attempts == 2 and ended.started_at < time.time() - 3000  # the first start, as a view shows it
    assert 0 <= ended.timings["start"] < 60, ended.timings
