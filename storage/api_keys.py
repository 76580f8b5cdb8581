"""API keys kept in Redis, stored hashed: created, listed and revoked while the API runs.

A key is `sk_` and 32 random URL-safe characters. Redis holds only its SHA-256 digest (enough for
a random secret of that length: nothing to brute-force) in one hash (`RedisKeys.api_keys`), field =
digest, value = the key's record as JSON: its id (`key_` and 12 hex digits, what `stepwise keys
list` shows and `revoke` accepts), tenant, scope (`tenant`, or `admin` for operators), when it was
created and the key's first characters (to recognise it). `RedisKeys.api_key_ids` maps each id to
its digest. A key is shown once, when it is created.

The API reads the whole hash again at most once a second (`ApiKeyTable`), so a key created or
revoked is honoured by every API process within a second, without a restart; a key it does not know
is looked up by its digest at once (one HGET), so a new key works at once in every process, whichever
one a client's next request reaches. A revocation is also
published (`RedisKeys.api_key_revocations`, the key's id): the requests still open with that key,
event streams and waits, end at once (storage.job_events).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import cast

import redis

from settings import default
from storage.errors import RedisUnavailableError
from storage.redis_keys import RedisKeys
from storage.replica_wait import ReplicaWait

SCOPES = ("tenant", "admin")  # admin: also /metrics and every tenant's queue totals
KEY_PREFIX = "sk_"
ID_PREFIX = "key_"
SHOWN_CHARS = 8  # of a key, kept to recognise it in a listing
REFRESH_SECONDS = 1.0


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    tenant: str
    scope: str  # one of SCOPES
    created_at: float  # unix seconds
    shown: str  # the key's first SHOWN_CHARS characters

    @property
    def is_admin(self) -> bool:
        return self.scope == "admin"


# Creating and revoking a key are each one script, so that they are atomic and a replica's confirmation can
# follow on the same connection (storage.replica_wait: a key revoked stays revoked through a failover).
CREATE_KEY = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[1])
return 1
"""
REVOKE_KEY = """
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[2])
return 1
"""


class ApiKeyStore:
    def __init__(self, client: redis.Redis, keys: RedisKeys, replica_wait: ReplicaWait | None = None) -> None:
        self._redis = client
        self.keys_key = keys.api_keys
        self.ids_key = keys.api_key_ids
        self.revocations_channel = keys.api_key_revocations
        self.replica_wait = replica_wait or ReplicaWait(client, default("STEPWISE_REDIS_REPLICA_WAIT"))
        self._create_key = client.register_script(CREATE_KEY)
        self._revoke_key = client.register_script(REVOKE_KEY)

    def create(self, tenant: str, scope: str = "tenant") -> tuple[str, ApiKey]:
        """A new key for `tenant`: (the key itself, shown only now; its record)."""
        if not tenant or not tenant.isprintable() or len(tenant) > 100:
            raise ValueError(f"a tenant is 1 to 100 printable characters (got {tenant!r})")
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)} (got {scope!r})")
        key = KEY_PREFIX + secrets.token_urlsafe(24)
        record = ApiKey(ID_PREFIX + secrets.token_hex(6), tenant, scope, time.time(), key[:SHOWN_CHARS])
        args = [digest_of(key), json.dumps(asdict(record)), record.key_id]
        self.replica_wait.run_script(self._create_key, [self.keys_key, self.ids_key], args)
        return key, record

    def all(self) -> dict[str, ApiKey]:
        """digest -> key record, every key; a malformed entry is skipped."""
        stored = cast(dict[bytes | str, bytes | str], self._redis.hgetall(self.keys_key))
        keys = {}
        for digest, text in stored.items():
            try:
                keys[_text(digest)] = ApiKey(**json.loads(text))
            except (ValueError, TypeError):
                continue
        return keys

    def find(self, digest: str) -> ApiKey | None:
        """The key record of one digest, or None if there is no such key (or its entry is malformed)."""
        text = self._redis.hget(self.keys_key, digest)
        try:
            return ApiKey(**json.loads(text)) if text is not None else None
        except (ValueError, TypeError):
            return None

    def revoke(self, key_or_id: str) -> ApiKey | None:
        """Revoke a key given by itself or by its id; returns what was revoked, or None if no such key."""
        digest = self._redis.hget(self.ids_key, key_or_id) if key_or_id.startswith(ID_PREFIX) else None
        digest = _text(digest) if digest is not None else digest_of(key_or_id)
        text = self._redis.hget(self.keys_key, digest)
        if text is None:
            return None
        record = ApiKey(**json.loads(text))
        args = [digest, record.key_id, self.revocations_channel]
        self.replica_wait.run_script(self._revoke_key, [self.keys_key, self.ids_key], args)
        return record

    def revoked_among(self, key_ids: list[str]) -> set[str]:
        """Which of these key ids no longer name a key (revoked)."""
        if not key_ids:
            return set()
        found = cast(list, self._redis.hmget(self.ids_key, key_ids))
        return {key_id for key_id, digest in zip(key_ids, found) if digest is None}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ApiKeyTable:
    """Every key of an ApiKeyStore by digest, read again at most once per `refresh_seconds`. If a refresh
    fails the keys read before stay in force; with none read yet, `lookup` raises RedisUnavailableError."""

    def __init__(
        self,
        store: ApiKeyStore,
        refresh_seconds: float = REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.refresh_seconds = refresh_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, ApiKey] | None = None
        self._read_at = float("-inf")

    def lookup(self, key: str) -> ApiKey | None:
        digest = digest_of(key)
        found = self._current(self.refresh_seconds).get(digest)
        if found is None:  # maybe created since the last read (by `stepwise keys create`, or through another process)
            try:
                found = self.store.find(digest)
            except redis.exceptions.RedisError:
                return None  # as with a failed refresh: the keys read before are what is known
            if found is not None:
                with self._lock:
                    assert self._keys is not None
                    self._keys[digest] = found
        return found

    def _current(self, max_age: float) -> dict[str, ApiKey]:
        """The keys, read again first if the last read is `max_age` seconds old."""
        with self._lock:
            if self.clock() - self._read_at >= max_age:
                try:
                    self._keys = self.store.all()
                    self._read_at = self.clock()
                except redis.exceptions.RedisError as e:
                    if self._keys is None:
                        raise RedisUnavailableError(f"cannot read the API keys from Redis: {e}") from e
                    self._read_at = self.clock()  # keep the keys read before; try again in a second
            assert self._keys is not None
            return self._keys
