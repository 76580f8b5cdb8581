"""The queue's fair order across tenants (storage.fair_share), against a real Redis: what take_next
hands out, and that a job's reported queue_position is the order it is then taken in."""

from __future__ import annotations

import pytest

from storage.fair_share import TenantWeights, TenantWeightsError, queue_cost
from storage.job_store import JobState, JobStore
from storage.queue_names import generate_queue

QUEUE = generate_queue("builtin:tiny")


def params(steps: int = 4, **fields) -> dict:
    return {"prompt": "a red fox", "seed": 7, "num_inference_steps": steps, **fields}


def queue_jobs(store: JobStore, tenant: str, count: int, **fields) -> list[str]:
    return [store.create(tenant=tenant, params=params(), **fields)[0].job_id for _ in range(count)]


def take(store: JobStore, count: int) -> list[str]:
    taken = [store.take_next(QUEUE, "w1", 30) for _ in range(count)]
    assert all(record is not None for record in taken), "the queue ran dry"
    return [record.job_id for record in taken]


def positions(store: JobStore, job_ids: list[str]) -> dict[str, int | None]:
    return dict(zip(job_ids, store.queue_positions([store.get(job_id) for job_id in job_ids])))


@pytest.fixture
def weighted_store(redis_url, clock):
    with JobStore(redis_url, clock=clock, tenant_weights=TenantWeights({"gold": 3.0})) as job_store:
        yield job_store


def test_a_tenant_with_nothing_queued_is_served_next_whatever_another_tenant_has_queued(store):
    backlog = queue_jobs(store, "bulk", 200)
    held = take(store, 12)  # what a worker holds at once
    assert held == backlog[:12]

    interactive = queue_jobs(store, "alice", 3)
    reported = positions(store, interactive)
    next_taken = take(store, 6)

    assert next_taken[0] == interactive[0] and reported[interactive[0]] == 0
    # Tied tags may go either way, so alice's second and third come within one bulk job of each other.
    assert set(interactive) <= set(next_taken[:5])
    for job_id in interactive:
        assert next_taken.index(job_id) == reported[job_id], (reported, next_taken)


def test_busy_tenants_are_served_in_proportion_to_their_weights(weighted_store):
    gold = queue_jobs(weighted_store, "gold", 60)
    bronze = queue_jobs(weighted_store, "bronze", 60)

    first = take(weighted_store, 40)

    assert (sum(job_id in gold for job_id in first), sum(job_id in bronze for job_id in first)) == (30, 10)


def test_one_tenants_jobs_keep_their_order_and_cost_counts_in_steps(store):
    long_jobs = [store.create(tenant="slow", params=params(steps=40))[0].job_id for _ in range(3)]
    short_jobs = [store.create(tenant="quick", params=params(steps=4))[0].job_id for _ in range(30)]

    order = take(store, 33)

    assert [job_id for job_id in order if job_id in long_jobs] == long_jobs
    assert [job_id for job_id in order if job_id in short_jobs] == short_jobs
    # 40 steps weigh as much as ten 4-step jobs: the quick tenant gets ten jobs per slow one.
    assert order.index(long_jobs[1]) >= 10 and order.index(long_jobs[1]) <= 12


def test_a_higher_priority_job_is_taken_first_whichever_tenant_sent_it(store):
    queue_jobs(store, "bulk", 5)
    [high] = queue_jobs(store, "bulk", 1, priority="high")
    [low] = queue_jobs(store, "alice", 1, priority="low")

    order = take(store, 7)

    assert order[0] == high and order[-1] == low
    assert store.take_next(QUEUE, "w1", 30) is None


def test_a_re_queued_job_goes_back_to_the_head_of_its_queue(store):
    backlog = queue_jobs(store, "bulk", 10)
    [first] = take(store, 1)
    others = queue_jobs(store, "alice", 2)

    assert store.release(first, "w1#1")

    assert positions(store, [first])[first] == 0
    assert take(store, 1) == [first]
    assert take(store, 1) == [others[0]]
    assert store.get(backlog[1]).state is JobState.QUEUED


def test_a_job_canceled_while_queued_gives_its_tenants_share_back(store):
    mine = queue_jobs(store, "alice", 10)
    others = queue_jobs(store, "bulk", 10)
    for job_id in mine:
        store.request_cancel(job_id)
    assert take(store, 2) == others[:2]

    [again] = queue_jobs(store, "alice", 1)

    assert positions(store, [again])[again] == 0, "alice's canceled jobs must not push her next one back"
    assert take(store, 2) == [again, others[2]]


def test_positions_stay_the_take_order_as_jobs_are_taken_canceled_and_re_queued(store):
    job_ids = queue_jobs(store, "bulk", 8) + queue_jobs(store, "alice", 4) + queue_jobs(store, "bob", 2)
    taken = take(store, 3)
    store.request_cancel(job_ids[5])
    store.release(taken[1], "w1#1")
    queued = [job_id for job_id in job_ids if store.get(job_id).state is JobState.QUEUED]

    reported = positions(store, queued)
    order = take(store, len(queued))

    assert sorted(reported.values()) == list(range(len(queued)))
    assert [order.index(job_id) for job_id in queued] == [reported[job_id] for job_id in queued]


def test_tenant_weights_are_read_as_tenant_weight_pairs():
    assert TenantWeights.parse("gold:4, bulk:0.25,,").weights == {"gold": 4.0, "bulk": 0.25}
    assert TenantWeights.parse("team:a:2").weights == {"team:a": 2.0}  # the weight follows the last colon
    assert TenantWeights.parse("").of("anyone") == 1.0
    with pytest.raises(TenantWeightsError, match="STEPWISE_TENANT_WEIGHTS"):
        TenantWeights.parse("gold:fast")


def test_a_jobs_cost_is_its_planned_steps_over_its_images():
    assert queue_cost(params(steps=20)) == 20.0
    assert queue_cost(params(steps=20, num_images=3)) == 60.0
    assert queue_cost({"prompt": "x", "no_such_field": 1}) == 1.0


def test_positions_read_together_count_a_job_re_queued_after_its_record_was_read(store):
    [victim, *waiting] = queue_jobs(store, "bulk", 4)
    assert take(store, 1) == [victim]
    records = [store.get(job_id) for job_id in [victim, *waiting]]  # the victim's says running
    assert store.release(victim, "w1#1", reason="worker_lost")  # back at the head of the queue

    reported = dict(zip([victim, *waiting], store.queue_positions(records)))

    assert reported == {victim: 0, waiting[0]: 1, waiting[1]: 2, waiting[2]: 3}
    assert take(store, 4) == [victim, *waiting]
    assert store.queue_positions(records) == [None] * 4  # all taken since: none is queued now
