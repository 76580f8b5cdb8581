"""DeadWorkerWatch on a real Redis with hand-written heartbeats and a hand-moved clock: a worker is
dead only once this watch saw its heartbeat unchanged for the timeout while Redis answered."""

from __future__ import annotations

import time

import pytest

from storage.heartbeats import Heartbeat
from storage.job_store import JobState, JobStore
from tests.support.job_factories import FakeClock, make_job
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


def watch_of(store: JobStore, clock: FakeClock, sent: list) -> DeadWorkerWatch:
    return DeadWorkerWatch(store, sent.append, timeout=TIMEOUT, own_worker_id="me", clock=clock)


def test_a_silent_workers_job_is_requeued_once_and_a_beating_workers_job_stays(store):
    clock, sent = FakeClock(0.0), []
    watch = watch_of(store, clock, sent)
    silent, beating = make_job(store), make_job(store)
    store.take(silent.job_id, "dead-worker", 60)
    store.take(beating.job_id, "live-worker", 60)
    beat(store, "dead-worker", 100.0)
    for second in range(12):
        beat(store, "live-worker", 100.0 + second)
        requeued = watch.sweep()
        assert requeued == ([silent.job_id] if second == TIMEOUT else []), second
        clock.advance(1)

    assert [record.job_id for record in sent] == [silent.job_id]
    assert store.get(silent.job_id).state is JobState.QUEUED
    assert store.get(silent.job_id).requeue_reason == "worker_lost"
    assert store.get(beating.job_id).state is JobState.RUNNING


def test_after_a_failed_read_every_worker_gets_a_whole_timeout_again(store, monkeypatch):
    clock, sent = FakeClock(0.0), []
    watch = watch_of(store, clock, sent)
    job = make_job(store)
    store.take(job.job_id, "w1", 60)
    beat(store, "w1", 100.0)
    watch.sweep()
    clock.advance(TIMEOUT - 1)
    with monkeypatch.context() as patched:  # Redis away for a moment, as in a restart
        patched.setattr(store.heartbeat_store, "heartbeats", lambda now: (_ for _ in ()).throw(ConnectionError("down")))
        with pytest.raises(ConnectionError):
            watch.sweep()
    clock.advance(2)

    assert watch.sweep() == []  # silent for more than the timeout, but not watched that long since
    clock.advance(TIMEOUT)
    assert watch.sweep() == [job.job_id]


def test_the_watch_never_judges_its_own_worker(store):
    clock, sent = FakeClock(0.0), []
    watch = watch_of(store, clock, sent)
    job = make_job(store)
    store.take(job.job_id, "me", 60)
    beat(store, "me", 1.0)
    watch.sweep()
    clock.advance(TIMEOUT * 3)

    assert watch.sweep() == [] and store.get(job.job_id).state is JobState.RUNNING


def test_running_holders_names_the_worker_of_each_running_job(store):
    running, queued = make_job(store), make_job(store)
    store.take(running.job_id, "w1", 30)

    assert running_holders(store) == {running.job_id: "w1"}
    assert queued.job_id not in running_holders(store)


def test_a_queue_whose_messages_died_with_a_worker_gets_one_more_while_none_waits(redis_url):
    from storage.queue_names import broker_queue_keys
    from worker.leases import LapsedLeaseSweeper, queue_name

    clock = FakeClock(time.time())
    with JobStore(redis_url, clock=clock) as store:
        record = make_job(store)
        store.mark_sent(record.job_id)  # its message was delivered: to a worker that died holding it
        sent = []
        sweeper = LapsedLeaseSweeper(store, sent.append, interval=15, unsent_grace=60)

        assert sweeper.send_to_starved_queues() == []  # queued for less than a lease
        clock.advance(61)
        assert sweeper.send_to_starved_queues() == [queue_name(record)]
        assert [job.job_id for job in sent] == [record.job_id]

        store.redis.lpush(broker_queue_keys(queue_name(record))[0], "a message waiting")
        assert sweeper.send_to_starved_queues() == []  # a message waits: it will take the job


def test_a_job_requeued_by_a_worker_that_died_before_sending_its_message_is_sent_one_a_lease_later(redis_url):
    """The one path that leaves a queued job without its message: a re-queue (release) records the message it
    owes, and the worker sends it after; a worker that dies in between leaves it owed, and a sweeper sends it."""
    from worker.leases import LapsedLeaseSweeper

    clock = FakeClock(time.time())
    with JobStore(redis_url, clock=clock) as store:
        record = make_job(store)
        store.mark_sent(record.job_id)  # created with its message, as the API does
        store.take(record.job_id, "w1", 30)
        assert store.release(record.job_id, "w1", "worker_drained", "w1: admission stopped")  # then w1 dies
        sent = []
        sweeper = LapsedLeaseSweeper(store, sent.append, interval=15, unsent_grace=60)

        assert sweeper.send_unsent() == []  # its worker may still send it
        clock.advance(61)
        assert sweeper.send_unsent() == [record.job_id]
        assert [job.job_id for job in sent] == [record.job_id] and sweeper.send_unsent() == []


def test_a_lapsed_lease_this_worker_still_holds_is_not_requeued_by_its_own_sweeper(redis_url):
    """A starved worker's keeper renews late: its own sweeper must not hand its running jobs out again
    (another worker's sweeper still may, as it cannot tell late from dead)."""
    from worker.leases import LapsedLeaseSweeper

    clock = FakeClock(time.time())
    with JobStore(redis_url, clock=clock) as store:
        held, dropped = make_job(store), make_job(store)
        for record in (held, dropped):
            store.mark_sent(record.job_id)
            store.take(record.job_id, "me", 3)
        clock.advance(10)  # both leases lapsed: the keeper was starved
        sent = []
        own = LapsedLeaseSweeper(
            store, sent.append, interval=1, unsent_grace=3, is_held_here={held.job_id}.__contains__
        )

        assert own.sweep() == [dropped.job_id]  # no task thread holds this one here any more
        assert store.get(held.job_id).state is JobState.RUNNING and store.renew_lease(held.job_id, "me", 3)
        clock.advance(10)
        other = LapsedLeaseSweeper(store, sent.append, interval=1, unsent_grace=3)
        assert other.sweep() == [held.job_id]
        assert [job.job_id for job in sent] == [dropped.job_id, held.job_id]
