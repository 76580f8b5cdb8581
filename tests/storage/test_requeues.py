"""A re-queued job keeps its history: attempts, why it went back, its first start, and a queue wait
that never counts an earlier attempt's run time. Against a real Redis, with a hand-moved clock."""

from __future__ import annotations

import pytest

from storage.job_store import JobState
from tests.support.job_factories import make_job, take_job


def test_a_released_job_keeps_its_first_start_and_says_why_it_went_back(store, clock):
    record = make_job(store)
    clock.advance(4)  # queued 4 s
    first = take_job(store, record.job_id, "w1")
    clock.advance(50)  # ran 50 s, then its worker died

    assert store.release(record.job_id, first.holder, "worker_lost", "worker w1 sent no heartbeat for 10s")
    requeued = store.get(record.job_id)
    assert requeued.state is JobState.QUEUED and requeued.attempts == 1
    assert requeued.requeued_at == clock.now
    assert (requeued.requeue_reason, requeued.requeue_message) == ("worker_lost", "worker w1 sent no heartbeat for 10s")

    clock.advance(6)  # queued again 6 s
    second = take_job(store, record.job_id, "w2")

    assert second.attempts == 2 and second.worker_id == "w2"
    assert second.started_at == first.started_at
    assert second.queued_seconds == pytest.approx(4 + 6)  # not 4 + 50 + 6
    assert first.queued_seconds == pytest.approx(4)


def test_only_the_holder_releases_so_two_sweepers_cannot_both_requeue_a_job(store):
    record = make_job(store)
    holder = take_job(store, record.job_id).holder

    outcomes = [store.release(record.job_id, holder, "worker_lost", "dead") for _ in range(2)]

    assert outcomes == [True, False]
    assert store.queue_depth() == 1


def test_a_lapsed_lease_is_recorded_as_the_reason(store, clock):
    record = make_job(store)
    take_job(store, record.job_id)
    clock.advance(31)

    assert store.release_if_lapsed(record.job_id)
    assert store.get(record.job_id).requeue_reason == "lease_expired"
