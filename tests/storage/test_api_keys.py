"""API keys kept in Redis: stored hashed, found by the key, revoked by the key or its id, and seen by
a reader within its refresh interval. Real Redis, a hand-moved clock."""

from __future__ import annotations

import pytest
import redis

from storage.api_keys import ApiKeyStore, ApiKeyTable
from storage.errors import StorageUnavailableError
from storage.redis_keys import RedisKeys
from tests.support.job_factories import FakeClock


@pytest.fixture
def key_store(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield ApiKeyStore(client, RedisKeys("stepwise"))
    client.close()


def test_a_created_key_is_stored_only_as_its_digest(key_store, redis_url):
    key, record = key_store.create("team-a")

    raw = redis.Redis.from_url(redis_url).dump(RedisKeys("stepwise").api_keys)
    assert key.startswith("sk_") and len(key) > 30
    assert key.encode() not in raw and key[8:].encode() not in raw
    assert (record.tenant, record.scope, record.shown) == ("team-a", "tenant", key[:8])


def test_a_reader_sees_a_new_key_at_once_and_a_revoked_one_within_its_refresh(key_store):
    clock = FakeClock(0.0)
    table = ApiKeyTable(key_store, refresh_seconds=1.0, clock=clock)
    assert table.lookup("sk_nothing_yet") is None
    key, record = key_store.create("team-a", "admin")

    assert table.lookup(key) == record and record.is_admin  # a miss looks the key up: no wait for a new key

    assert key_store.revoke(record.key_id) == record
    clock.advance(0.5)
    assert table.lookup(key) == record  # a known key waits for the refresh: one read a second, however busy
    clock.advance(0.5)
    assert table.lookup(key) is None
    assert table.lookup("sk_nothing_yet") is None  # an unknown key stays unknown


def test_a_key_is_revoked_by_itself_too_and_an_unknown_one_is_reported(key_store):
    key, record = key_store.create("team-b")

    assert key_store.revoke(key) == record
    assert key_store.revoke(key) is None and key_store.revoke("key_000000000000") is None
    assert key_store.all() == {}


def test_bad_tenants_and_scopes_are_refused(key_store):
    for tenant, scope in (("", "tenant"), ("a\nb", "tenant"), ("ok", "root")):
        with pytest.raises(ValueError):
            key_store.create(tenant, scope)


def test_without_redis_a_table_never_read_is_unavailable_and_a_read_one_keeps_its_keys(key_store, own_redis):
    store = ApiKeyStore(redis.Redis.from_url(own_redis.url, socket_connect_timeout=1), RedisKeys("stepwise"))
    key, record = store.create("team-c")
    clock = FakeClock(0.0)
    read, unread = ApiKeyTable(store, clock=clock), ApiKeyTable(store, clock=clock)
    assert read.lookup(key) == record
    own_redis.stop()
    clock.advance(5)

    assert read.lookup(key) == record
    with pytest.raises(StorageUnavailableError):
        unread.lookup(key)
