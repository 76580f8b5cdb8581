"""Creating, reading and listing job records, and idempotent creation, against a real Redis."""

from __future__ import annotations

import pytest
import redis

from storage import tenant_listing
from storage.job_store import (
    IdempotencyConflictError,
    InvalidCursorError,
    JobState,
    JobStore,
    StorageUnavailableError,
)
from tests.support.job_factories import make_job, take_job


def list_all_pages(store: JobStore, tenant: str, **kwargs) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        records, cursor = store.list_for_tenant(tenant, cursor=cursor, **kwargs)
        pages.append([record.job_id for record in records])
        if cursor is None:
            return pages


def test_a_created_job_reads_back_with_every_field(store, clock):
    record, created = store.create(
        tenant="acme",
        params={"prompt": "a red fox", "seed": 7, "guidance_scale": 7.5},
        deadline=clock.now + 600,
        webhook_url="https://example.com/hook",
        webhook_events=["succeeded"],
    )

    assert created
    assert store.get(record.job_id) == record
    assert record.state is JobState.QUEUED
    assert record.created_at == clock.now
    assert record.deadline == clock.now + 600
    assert record.params == {"prompt": "a red fox", "seed": 7, "guidance_scale": 7.5}
    assert record.webhook_events == ["succeeded"]
    assert record.attempts == 0 and record.worker_id is None and not record.cancel_requested


def test_the_state_is_stored_as_a_lowercase_string(store, redis_url):
    record = make_job(store)

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert client.hget(f"stepwise:job:{record.job_id}", "state") == "queued"
    client.close()


def test_job_ids_are_unique_and_url_safe(store):
    job_ids = {make_job(store).job_id for _ in range(20)}

    assert len(job_ids) == 20
    assert all(job_id.isalnum() for job_id in job_ids)


def test_an_unknown_job_reads_as_none(store):
    assert store.get("no-such-job") is None


def test_listing_is_newest_first_and_pages_with_a_cursor(store, clock):
    job_ids = []
    for _ in range(7):
        job_ids.append(make_job(store).job_id)
        clock.advance(1)

    pages = list_all_pages(store, "acme", limit=3)

    assert pages == [job_ids[6:3:-1], job_ids[3:0:-1], job_ids[:1]]


def test_a_page_that_ends_exactly_at_the_last_job_has_no_cursor(store, clock):
    for _ in range(4):
        make_job(store)
        clock.advance(1)

    records, cursor = store.list_for_tenant("acme", limit=4)

    assert len(records) == 4 and cursor is None


def test_jobs_created_in_the_same_instant_page_without_loss_or_repeats(store, monkeypatch):
    monkeypatch.setattr(tenant_listing, "INDEX_CHUNK", 3)
    job_ids = {make_job(store).job_id for _ in range(11)}

    pages = list_all_pages(store, "acme", limit=2)

    listed = [job_id for page in pages for job_id in page]
    assert sorted(listed) == sorted(job_ids)
    assert listed == sorted(job_ids, reverse=True)


def test_a_job_created_while_paging_does_not_shift_the_next_page(store, clock):
    job_ids = []
    for _ in range(4):
        job_ids.append(make_job(store).job_id)
        clock.advance(1)

    first, cursor = store.list_for_tenant("acme", limit=2)
    make_job(store)
    second, _ = store.list_for_tenant("acme", limit=2, cursor=cursor)

    assert [r.job_id for r in first] == [job_ids[3], job_ids[2]]
    assert [r.job_id for r in second] == [job_ids[1], job_ids[0]]


def test_listing_filters_by_state(store, clock):
    running = make_job(store)
    clock.advance(1)
    done = make_job(store)
    clock.advance(1)
    queued = make_job(store)
    take_job(store, running.job_id)
    store.finish(done.job_id, JobState.SUCCEEDED, holder=take_job(store, done.job_id).holder)

    def listed(state):
        return [r.job_id for r in store.list_for_tenant("acme", state=state)[0]]

    assert listed(JobState.QUEUED) == [queued.job_id]
    assert listed(JobState.RUNNING) == [running.job_id]
    assert listed(JobState.SUCCEEDED) == [done.job_id]
    assert listed(JobState.FAILED) == []
    assert listed(None) == [queued.job_id, done.job_id, running.job_id]  # newest first


def test_a_tenant_lists_only_its_own_jobs(store, clock):
    mine = make_job(store, tenant="acme")
    clock.advance(1)
    make_job(store, tenant="globex")

    records, _ = store.list_for_tenant("acme")

    assert [r.job_id for r in records] == [mine.job_id]
    assert store.list_for_tenant("initech") == ([], None)


def test_listing_skips_and_forgets_records_that_expired(store, clock, redis_url):
    kept = make_job(store)
    clock.advance(1)
    gone = make_job(store)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.delete(f"stepwise:job:{gone.job_id}")  # what the TTL does to a terminal record

    records, _ = store.list_for_tenant("acme")

    assert [r.job_id for r in records] == [kept.job_id]
    assert client.zscore("stepwise:tenant-jobs:all:acme", gone.job_id) is None
    client.close()


def test_a_cursor_this_store_did_not_hand_out_is_refused(store):
    with pytest.raises(InvalidCursorError, match="cursor"):
        store.list_for_tenant("acme", cursor="not a cursor!")


def test_the_same_idempotency_key_and_body_return_the_original_job(store):
    first, created = store.create(tenant="acme", params={"prompt": "fox"}, idempotency_key="k1", request_hash="h1")
    again, created_again = store.create(
        tenant="acme", params={"prompt": "fox"}, idempotency_key="k1", request_hash="h1"
    )

    assert created and not created_again
    assert again == first
    assert store.queue_depth() == 1


def test_the_same_idempotency_key_with_another_body_is_a_conflict(store):
    store.create(tenant="acme", params={"prompt": "fox"}, idempotency_key="k1", request_hash="h1")

    with pytest.raises(IdempotencyConflictError, match="k1"):
        store.create(tenant="acme", params={"prompt": "owl"}, idempotency_key="k1", request_hash="h2")


def test_idempotency_keys_are_per_tenant(store):
    acme, _ = store.create(tenant="acme", params={"prompt": "fox"}, idempotency_key="k1", request_hash="h1")
    globex, created = store.create(tenant="globex", params={"prompt": "fox"}, idempotency_key="k1", request_hash="h1")

    assert created and globex.job_id != acme.job_id


def test_a_tenant_name_with_a_colon_cannot_collide_with_another_tenants_idempotency_key(store):
    first, _ = store.create(tenant="a:b", params={}, idempotency_key="c", request_hash="h")
    second, created = store.create(tenant="a", params={}, idempotency_key="b:c", request_hash="h")

    assert created and second.job_id != first.job_id


def test_an_idempotency_key_expires_with_its_finished_job(store, redis_url):
    record, _ = store.create(tenant="acme", params={}, idempotency_key="k1", request_hash="h1")
    store.request_cancel(record.job_id)

    client = redis.Redis.from_url(redis_url)
    assert 0 < client.ttl("stepwise:idem:acme:k1") <= 3600
    client.close()


def test_redis_down_raises_storage_unavailable_and_recovers_after_restart(own_redis):
    store = JobStore(own_redis.url)
    record = make_job(store)
    own_redis.stop()

    assert store.ping() is False
    with pytest.raises(StorageUnavailableError, match="unavailable"):
        store.get(record.job_id)
    with pytest.raises(StorageUnavailableError):
        store.create(tenant="acme", params={})
    with pytest.raises(StorageUnavailableError):
        store.take_next(record.queue, "w1", 30)

    own_redis.start()
    assert store.ping() is True
    assert take_job(store, record.job_id).state is JobState.RUNNING
    store.close()
