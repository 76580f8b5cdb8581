"""DeadWorkerWatch on a real Redis with hand-written heartbeats and a hand-moved clock: a worker is
dead only once this watch saw its heartbeat unchanged for the timeout while Redis answered."""

from __future__ import annotations

import time

import pytest

from storage.heartbeats import Heartbeat
from storage.job_store import JobState, JobStore
from tests.support.job_factories import FakeClock, make_job, take_job
from worker.dead_workers import DeadWorkerWatch, running_holders

TIMEOUT = 10.0


def beat(store: JobStore, worker_id: str, seen_at: float) -> None:
    """A heartbeat `seen_at` seconds after this test module started (recent: the store keeps it)."""
    store.beat(Heartbeat(worker_id, "builtin:tiny", "q", "sd", 4, STARTED + seen_at))


STARTED = time.time()


@pytest.fixture
def store(redis_url):
    with JobStore(redis_url) as job_store:
        yield job_store


def watch_of(store: JobStore, clock: FakeClock) -> DeadWorkerWatch:
    return DeadWorkerWatch(store, timeout=TIMEOUT, own_worker_id="me", clock=clock)


def test_a_silent_workers_job_is_requeued_once_and_a_beating_workers_job_stays(store):
    clock = FakeClock(0.0)
    watch = watch_of(store, clock)
    silent, beating = make_job(store), make_job(store)
    take_job(store, silent.job_id, "dead-worker", 60)
    take_job(store, beating.job_id, "live-worker", 60)
    beat(store, "dead-worker", 100.0)
    for second in range(12):
        beat(store, "live-worker", 100.0 + second)
        requeued = watch.sweep()
        assert requeued == ([silent.job_id] if second == TIMEOUT else []), second
        clock.advance(1)

    assert store.get(silent.job_id).state is JobState.QUEUED
    assert store.get(silent.job_id).requeue_reason == "worker_lost"
    assert store.get(beating.job_id).state is JobState.RUNNING


def test_after_a_failed_read_every_worker_gets_a_whole_timeout_again(store, monkeypatch):
    clock = FakeClock(0.0)
    watch = watch_of(store, clock)
    job = make_job(store)
    take_job(store, job.job_id, "w1", 60)
    beat(store, "w1", 100.0)
    watch.sweep()
    clock.advance(TIMEOUT - 1)
    with monkeypatch.context() as patched:  # Redis away for a moment, as in a restart
        patched.setattr(
            store.heartbeat_store, "seen_at_by_worker", lambda now: (_ for _ in ()).throw(ConnectionError("down"))
        )
        with pytest.raises(ConnectionError):
            watch.sweep()
    clock.advance(2)

    assert watch.sweep() == []  # silent for more than the timeout, but not watched that long since
    clock.advance(TIMEOUT)
    assert watch.sweep() == [job.job_id]


def test_a_worker_that_comes_back_and_dies_again_loses_its_new_jobs_too(store):
    clock = FakeClock(0.0)
    watch = watch_of(store, clock)
    first, second = make_job(store), make_job(store)
    take_job(store, first.job_id, "flaky", 60)
    beat(store, "flaky", 100.0)
    watch.sweep()
    clock.advance(TIMEOUT)
    assert watch.sweep() == [first.job_id]
    clock.advance(1)
    assert watch.sweep() == []  # still dead, nothing more of its to re-queue

    beat(store, "flaky", 200.0)  # it was only stalled: it beats again, and takes a job
    # The first job, re-queued, and the second wait side by side; which comes next is the fair order's choice.
    retaken = store.take_next(second.queue, "flaky", 60)
    assert retaken is not None and retaken.job_id in {first.job_id, second.job_id}
    watch.sweep()
    clock.advance(TIMEOUT)

    assert watch.sweep() == [retaken.job_id]


def test_the_watch_never_judges_its_own_worker(store):
    clock = FakeClock(0.0)
    watch = watch_of(store, clock)
    job = make_job(store)
    take_job(store, job.job_id, "me", 60)
    beat(store, "me", 1.0)
    watch.sweep()
    clock.advance(TIMEOUT * 3)

    assert watch.sweep() == [] and store.get(job.job_id).state is JobState.RUNNING


def test_running_holders_names_the_attempt_holding_each_running_job(store):
    running, queued = make_job(store), make_job(store)
    take_job(store, running.job_id, "w1")

    assert running_holders(store) == {running.job_id: "w1#1"}
    assert queued.job_id not in running_holders(store)


def test_a_watch_re_queues_only_the_attempt_it_judged_not_one_the_revived_worker_took_since(store):
    """A worker frozen past the timeout is judged dead; if it wakes and takes the job again before the watch acts on
    what it read, the release names the old attempt and is refused."""
    clock = FakeClock(0.0)
    watch = watch_of(store, clock)
    job = make_job(store)
    first = take_job(store, job.job_id, "frozen")
    beat(store, "frozen", 100.0)
    watch.sweep()
    clock.advance(TIMEOUT)
    assert watch.sweep() == [job.job_id]  # judged dead: its attempt 1 goes back to the queue
    second = take_job(store, job.job_id, "frozen")  # it woke and took the job again: attempt 2

    assert (first.holder, second.holder) == ("frozen#1", "frozen#2")
    assert store.release(job.job_id, first.holder, "worker_lost") is False  # what a watch that read before does
    assert store.get(job.job_id).state is JobState.RUNNING and store.get(job.job_id).holder == "frozen#2"


def test_a_new_or_requeued_job_wakes_its_queues_waiting_worker_in_the_same_step(store):
    """No message per job: queueing one pushes a wake-up token in its own script (storage.lua), so an idle worker
    blocked on its queue takes it at once; a job re-queued by a worker that dies right after needs no one to
    send anything."""
    record = make_job(store)
    assert store.wait_for_work(record.queue, timeout=1) is True  # the token its create pushed
    assert store.wait_for_work(record.queue, timeout=0.1) is False  # one token per job
    taken = take_job(store, record.job_id, "w1")

    assert store.release(record.job_id, taken.holder, "worker_drained", "w1: admission stopped")  # then w1 dies

    assert store.wait_for_work(record.queue, timeout=1) is True
    assert store.take_next(record.queue, "w2", 30).job_id == record.job_id


def test_a_lapsed_lease_this_worker_still_holds_is_not_requeued_by_its_own_sweeper(redis_url):
    """A starved worker's keeper renews late: its own sweeper must not hand its running jobs out again
    (another worker's sweeper still may, as it cannot tell late from dead)."""
    from worker.leases import LapsedLeaseSweeper

    clock = FakeClock(time.time())
    with JobStore(redis_url, clock=clock) as store:
        held, dropped = make_job(store), make_job(store)
        for record in (held, dropped):
            take_job(store, record.job_id, "me", 3)
        clock.advance(10)  # both leases lapsed: the keeper was starved
        own = LapsedLeaseSweeper(store, interval=1, is_held_here={held.job_id}.__contains__)

        assert own.sweep() == [dropped.job_id]  # no job thread holds this one here any more
        assert store.get(held.job_id).state is JobState.RUNNING and store.renew_lease(held.job_id, "me#1", 3)
        clock.advance(10)
        other = LapsedLeaseSweeper(store, interval=1)
        assert other.sweep() == [held.job_id]
