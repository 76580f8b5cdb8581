"""State transitions, leases, cancellation, TTL, queue and counts, against a real Redis."""

from __future__ import annotations

import threading

import pytest
import redis

from storage.job_store import (
    Created,
    CreateLimits,
    InvalidTransitionError,
    JobNotFoundError,
    JobState,
    JobStore,
    QueueFullError,
    RateLimitedError,
    TenantQueueFullError,
)
from storage.new_job import NewJobSpec
from tests.support.job_factories import make_job, take_job


@pytest.fixture
def client(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_take_moves_a_queued_job_to_running_with_a_lease(store, clock):
    record = make_job(store)
    clock.advance(5)

    taken = store.take_next(record.queue, "worker-1", lease_seconds=30)

    assert taken.state is JobState.RUNNING
    assert taken.worker_id == "worker-1"
    assert taken.attempts == 1 and taken.holder == "worker-1#1"
    assert taken.started_at == clock.now
    assert taken.lease_expires_at == clock.now + 30
    assert store.get(record.job_id) == taken


def test_only_one_of_two_racing_workers_takes_a_job(redis_url):
    stores = [JobStore(redis_url), JobStore(redis_url)]

    for _ in range(20):
        job_id = make_job(stores[0]).job_id
        barrier = threading.Barrier(2)
        winners = []

        def race(
            worker: int, job_id: str = job_id, barrier: threading.Barrier = barrier, winners: list[int] = winners
        ) -> None:
            barrier.wait()
            taken = stores[worker].take_next(stores[worker].get(job_id).queue, f"worker-{worker}", 30)
            if taken is not None:
                assert taken.job_id == job_id
                winners.append(worker)

        threads = [threading.Thread(target=race, args=(worker,)) for worker in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(winners) == 1
        assert stores[0].get(job_id).worker_id == f"worker-{winners[0]}"
        assert stores[0].get(job_id).attempts == 1
    for store in stores:
        store.close()


def test_a_finished_job_refuses_every_further_transition(store):
    record = make_job(store)
    holder = take_job(store, record.job_id).holder
    assert store.finish(record.job_id, JobState.SUCCEEDED, holder=holder, image_keys=["images/x/0.png"])

    assert store.finish(record.job_id, JobState.FAILED, error_code="boom") is False
    assert store.take_next(record.queue, "w2", 30) is None
    assert store.renew_lease(record.job_id, holder, 30) is False
    assert store.release(record.job_id, holder) is False
    with pytest.raises(InvalidTransitionError, match="succeeded"):
        store.request_cancel(record.job_id)
    store.set_progress(record.job_id, 3, 20)

    final = store.get(record.job_id)
    assert final.state is JobState.SUCCEEDED
    assert final.image_keys == ["images/x/0.png"]
    assert final.error_code is None
    assert final.progress_step == 0


def test_finish_stores_the_results_and_the_finish_time(store, clock):
    record = make_job(store)
    holder = take_job(store, record.job_id).holder
    clock.advance(2)

    assert store.finish(
        record.job_id,
        JobState.FAILED,
        holder=holder,
        error_code="oom",
        error_message="out of memory",
        timings={"total": 2.0},
    )

    final = store.get(record.job_id)
    assert (final.state, final.error_code, final.error_message) == (JobState.FAILED, "oom", "out of memory")
    assert final.timings == {"total": 2.0}
    assert final.finished_at == clock.now
    assert final.lease_expires_at is None


def test_finish_refuses_a_non_terminal_state_or_a_field_the_store_owns(store):
    record = make_job(store)

    with pytest.raises(ValueError, match="terminal"):
        store.finish(record.job_id, JobState.RUNNING)
    with pytest.raises(ValueError, match="attempts"):
        store.finish(record.job_id, JobState.FAILED, attempts=9)


def test_a_worker_that_lost_the_job_cannot_finish_it(store, clock):
    record = make_job(store)
    first = take_job(store, record.job_id, "w1").holder
    clock.advance(31)
    assert store.release_if_lapsed(record.job_id)
    second = take_job(store, record.job_id, "w2").holder

    assert store.finish(record.job_id, JobState.SUCCEEDED, holder=first) is False
    assert store.finish(record.job_id, JobState.SUCCEEDED, holder=second) is True


def test_an_attempt_the_job_was_taken_away_from_cannot_write_even_when_its_worker_took_it_again(store, clock):
    """A worker frozen past its lease or the dead-worker timeout: the job is re-queued behind its back and the same
    worker takes it again. Its first attempt's writes are refused; only the new attempt's count."""
    record = make_job(store)
    first = take_job(store, record.job_id, "w1").holder
    clock.advance(31)
    assert store.release_if_lapsed(record.job_id)
    second = take_job(store, record.job_id, "w1").holder

    assert (first, second) == ("w1#1", "w1#2")
    assert store.renew_lease(record.job_id, first, 30) is False
    assert store.set_storing(record.job_id, first, "S3 is down") is False
    assert store.release(record.job_id, first, "worker_lost") is False
    assert store.finish(record.job_id, JobState.FAILED, holder=first, error_code="invalid_params") is False
    assert store.get(record.job_id).state is JobState.RUNNING
    assert store.renew_lease(record.job_id, second, 30)
    assert store.finish(record.job_id, JobState.SUCCEEDED, holder=second)


def test_a_queued_job_can_be_expired_without_a_worker(store):
    record = make_job(store)

    assert store.finish(record.job_id, JobState.EXPIRED, error_code="deadline_exceeded")
    assert store.get(record.job_id).state is JobState.EXPIRED
    assert store.queue_position(record) is None


def test_canceling_a_queued_job_cancels_it_at_once(store):
    record = make_job(store)

    assert store.request_cancel(record.job_id) is JobState.CANCELED

    assert store.get(record.job_id).state is JobState.CANCELED
    assert store.queue_depth() == 0
    assert store.take_next(record.queue, "w1", 30) is None
    assert store.is_cancel_requested(record.job_id)


def test_canceling_a_running_job_sets_a_flag_for_its_worker(store):
    record = make_job(store)
    holder = take_job(store, record.job_id).holder
    assert not store.is_cancel_requested(record.job_id)

    assert store.request_cancel(record.job_id) is JobState.RUNNING

    assert store.is_cancel_requested(record.job_id)
    assert store.get(record.job_id).cancel_requested
    assert store.finish(record.job_id, JobState.CANCELED, holder=holder)


def test_canceling_a_finished_or_unknown_job_is_an_error(store):
    record = make_job(store)
    store.request_cancel(record.job_id)

    with pytest.raises(InvalidTransitionError, match="canceled"):
        store.request_cancel(record.job_id)
    with pytest.raises(JobNotFoundError):
        store.request_cancel("no-such-job")


def test_a_lapsed_lease_is_found_and_released_back_to_the_queue(store, clock):
    record = make_job(store)
    holder = take_job(store, record.job_id, lease_seconds=30).holder

    assert store.lapsed_job_ids(clock.now + 29) == []
    assert store.lapsed_job_ids(clock.now + 31) == [record.job_id]

    clock.advance(31)
    assert store.release(record.job_id, holder)
    released = store.get(record.job_id)
    assert released.state is JobState.QUEUED
    assert released.worker_id is None and released.lease_expires_at is None
    assert released.attempts == 1
    assert store.queue_position(record) == 0
    assert store.lapsed_job_ids(clock.now + 1000) == []
    assert take_job(store, record.job_id, "w2").attempts == 2


def test_a_renewed_lease_does_not_lapse_and_is_not_released_by_the_reaper(store, clock):
    record = make_job(store)
    holder = take_job(store, record.job_id, lease_seconds=30).holder
    clock.advance(20)

    assert store.renew_lease(record.job_id, holder, 30)
    assert store.renew_lease(record.job_id, "w2#1", 30) is False

    assert store.lapsed_job_ids(clock.now + 15) == []
    assert store.release_if_lapsed(record.job_id, now=clock.now + 15) is False
    assert store.get(record.job_id).lease_expires_at == clock.now + 30


def test_only_the_holder_can_release_a_job(store):
    record = make_job(store)
    take_job(store, record.job_id, "w1")

    assert store.release(record.job_id, "w2#1") is False
    assert store.get(record.job_id).state is JobState.RUNNING


def test_releasing_a_job_whose_cancel_was_requested_cancels_it(store):
    record = make_job(store)
    holder = take_job(store, record.job_id).holder
    store.request_cancel(record.job_id)

    assert store.release(record.job_id, holder) is False
    assert store.get(record.job_id).state is JobState.CANCELED
    assert store.queue_depth() == 0


def test_terminal_records_expire_and_live_ones_do_not(store, client):
    running, done, queued = make_job(store), make_job(store), make_job(store)
    take_job(store, running.job_id)
    store.finish(done.job_id, JobState.SUCCEEDED, holder=take_job(store, done.job_id).holder)

    assert client.ttl(f"stepwise:job:{queued.job_id}") == -1
    assert client.ttl(f"stepwise:job:{running.job_id}") == -1
    assert 3590 < client.ttl(f"stepwise:job:{done.job_id}") <= 3600


def test_queue_position_counts_from_the_oldest_queued_job_of_the_same_model_and_priority(store, clock):
    records = []
    for _ in range(3):
        records.append(make_job(store))
        clock.advance(1)
    other_model, _ = store.create(tenant="t", params={"prompt": "x", "model": "builtin:small"})
    high, _ = store.create(tenant="t", params={"prompt": "x"}, priority="high")
    assert [store.queue_position(record) for record in records] == [0, 1, 2]
    assert store.queue_position(other_model) == 0 and store.queue_position(high) == 0
    assert store.queue_depth() == 5
    assert store.queued_by_priority(records[0].queue) == {"high": 1, "normal": 3, "low": 0}

    take_job(store, high.job_id)
    take_job(store, records[0].job_id)
    store.request_cancel(records[1].job_id)

    assert [store.queue_position(record) for record in records] == [None, None, 0]
    assert store.queued_by_priority(records[0].queue) == {"high": 0, "normal": 1, "low": 0}


def test_counts_by_state_follow_every_transition(store):
    records = [make_job(store) for _ in range(5)]
    take_job(store, records[0].job_id)
    store.finish(records[1].job_id, JobState.SUCCEEDED, holder=take_job(store, records[1].job_id).holder)
    store.request_cancel(records[2].job_id)
    store.finish(records[3].job_id, JobState.EXPIRED)
    store.finish(records[3].job_id, JobState.FAILED)

    assert store.counts_by_state() == {
        "queued": 1,
        "running": 1,
        "succeeded": 1,
        "failed": 0,
        "canceled": 1,
        "expired": 1,
    }


def test_progress_moves_only_while_the_job_runs(store):
    record = make_job(store)
    store.set_progress(record.job_id, 1, 20)
    assert store.get(record.job_id).progress_step == 0

    take_job(store, record.job_id)
    store.set_progress(record.job_id, 5, 20)
    assert (store.get(record.job_id).progress_step, store.get(record.job_id).progress_total) == (5, 20)

    store.set_progress("no-such-job", 1, 2)
    assert store.get("no-such-job") is None


def test_webhook_attempts_are_appended_in_order(store):
    record = make_job(store)
    store.add_webhook_attempt(record.job_id, {"attempt": 1, "status": 500})
    store.add_webhook_attempt(record.job_id, {"attempt": 2, "status": 200})

    assert store.get(record.job_id).webhook_attempts == [{"attempt": 1, "status": 500}, {"attempt": 2, "status": 200}]
    store.add_webhook_attempt("no-such-job", {"attempt": 1})
    assert store.get("no-such-job") is None


def test_created_jobs_wake_their_queues_workers_and_a_refused_one_wakes_none(store, client):
    specs = [NewJobSpec(tenant="acme", params={"prompt": f"fox {i}", "seed": i}) for i in range(3)]

    outcomes = store.create_many(specs, limits=CreateLimits(max_queued=2))

    created = [outcome.record for outcome in outcomes if isinstance(outcome, Created)]
    assert len(created) == 2 and isinstance(outcomes[2], QueueFullError)
    assert client.llen(store.keys.wake(created[0].queue)) == 2, "one wake-up per created job"
    assert {record.job_id for record in store.list_for_tenant("acme")[0]} == {r.job_id for r in created}


def test_a_tenants_limits_are_checked_job_by_job_in_the_create_and_a_replay_meets_none(store):
    limits = CreateLimits(tenant_max_queued=3, tenant_jobs_per_minute=2)
    first = NewJobSpec(tenant="acme", params={"prompt": "fox"}, idempotency_key="k", request_hash="h")

    outcomes = store.create_many(
        [first, first, first, NewJobSpec(tenant="acme", params={"prompt": "owl"})], limits=limits
    )
    more = store.create_many([NewJobSpec(tenant="acme", params={"prompt": "elk"})] * 2, limits=limits)

    created, replay, replay_again, second = outcomes
    assert created.created and not replay.created and not replay_again.created, "replays take no slot"
    assert replay.record.job_id == created.record.job_id
    assert second.created
    assert isinstance(more[0], RateLimitedError) and 0 < more[0].retry_after <= 60
    assert store.create_many([first], limits=limits)[0].record.job_id == created.record.job_id, "a replay at the rate"
    tenant_full = store.create_many([NewJobSpec(tenant="acme", params={"prompt": "elk"})], limits=CreateLimits(2))
    assert isinstance(tenant_full[0], QueueFullError)
    other = CreateLimits(tenant_max_queued=2)
    assert isinstance(store.create_many([NewJobSpec(tenant="acme", params={})], limits=other)[0], TenantQueueFullError)
    assert store.create_many([NewJobSpec(tenant="bob", params={})], limits=other)[0].created
