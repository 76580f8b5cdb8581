"""A tenant's jobs, newest first, paged with an opaque keyset cursor.

The cursor holds the (created_at, job_id) of the last job on a page, and the next page starts
strictly after it, so jobs created meanwhile never shift or repeat a page. Index entries whose
record has expired (terminal records have a TTL) are skipped and removed on the way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import cast

import redis

from storage.errors import InvalidCursorError
from storage.job_record import JobRecord, JobState, record_from_hash
from storage.redis_keys import RedisKeys

INDEX_CHUNK = 100  # index entries read per round trip


# A cursor is the (created_at, job_id) of the last job on a page, in plain text: `1796160328.3190002-<id>`.
# Every string of this form is a valid cursor (a position in the listing), so the OpenAPI document's
# pattern says exactly which cursors the API takes.
CURSOR_PATTERN = r"^[0-9]{1,17}(\.[0-9]{1,17})?-[0-9a-f]{32}$"
CURSOR_OR_NONE_PATTERN = r"^(?:[0-9]{1,17}(\.[0-9]{1,17})?-[0-9a-f]{32})?$"  # as a query parameter: empty is none
_CURSOR = re.compile(CURSOR_PATTERN)


def encode_cursor(score: float, job_id: str) -> str:
    cursor = f"{score!r}-{job_id}"
    assert _CURSOR.match(cursor), cursor  # created_at scores and uuid4 hex job ids always fit
    return cursor


def decode_cursor(cursor: str) -> tuple[float, str]:
    if not _CURSOR.match(cursor):
        raise InvalidCursorError(f"cursor {cursor!r} is not one this service returned")
    raw_score, _, job_id = cursor.partition("-")
    return float(raw_score), job_id


def iter_tenant_records(
    client: redis.Redis, keys: RedisKeys, tenant: str, state: JobState | None, after: tuple[float, str] | None
) -> Iterator[tuple[float, JobRecord]]:
    """Live records in index order (newest first, ties by job id descending) strictly after `after`.

    The offset only steps over entries that share the boundary score, which the (score, job id)
    filter has already passed.
    """
    index_key = keys.tenant_index(tenant, state)
    bound_score, bound_id = after if after else (float("inf"), None)
    num_skip = 0
    while True:
        top = "+inf" if bound_id is None else repr(bound_score)
        chunk = cast(
            list[tuple[str, float]],  # decode_responses=True, which redis-py's types cannot see
            client.zrevrangebyscore(index_key, top, "-inf", start=num_skip, num=INDEX_CHUNK, withscores=True),
        )
        entries = (
            chunk
            if bound_id is None
            else [(job_id, score) for job_id, score in chunk if score < bound_score or job_id < bound_id]
        )
        with client.pipeline(transaction=False) as pipe:
            for job_id, _ in entries:
                pipe.hgetall(keys.job(job_id))
            mappings = pipe.execute()
        expired_ids = {job_id for (job_id, _), mapping in zip(entries, mappings, strict=True) if not mapping}
        if expired_ids:
            _forget(client, keys, tenant, sorted(expired_ids))
        for (_, score), mapping in zip(entries, mappings, strict=True):
            if mapping:
                record = record_from_hash(mapping)
                if state is None or record.state == state:
                    yield score, record
        if len(chunk) < INDEX_CHUNK:
            return
        last_id, last_score = chunk[-1]
        num_ties = sum(1 for job_id, score in chunk if score == last_score and job_id not in expired_ids)
        num_skip = (num_skip if last_score == bound_score else 0) + num_ties
        if bound_id is None or last_score < bound_score or last_id < bound_id:
            bound_score, bound_id = last_score, last_id


def _forget(client: redis.Redis, keys: RedisKeys, tenant: str, job_ids: list[str]) -> None:
    with client.pipeline(transaction=False) as pipe:
        for state in (None, *JobState):
            pipe.zrem(keys.tenant_index(tenant, state), *job_ids)
        pipe.execute()


def tenant_totals(client: redis.Redis, keys: RedisKeys) -> dict[str, dict[str, int]]:
    """tenant -> {"queued": n, "running": m} for every tenant with a job in either state now (an operator's
    view: it scans the per-state index keys, so it is for /v1/admin and scrapes, not for the submit path)."""
    totals: dict[str, dict[str, int]] = {}
    for state in (JobState.QUEUED, JobState.RUNNING):
        prefix = keys.tenant_index("", state)
        names = [cast(str, name) for name in client.scan_iter(match=_glob_escape(prefix) + "*", count=500)]
        with client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.zcard(name)
            counts = pipe.execute()
        for name, count in zip(names, counts):
            if count:
                tenant = (name.decode() if isinstance(name, bytes) else name)[len(prefix) :]
                totals.setdefault(tenant, {"queued": 0, "running": 0})[state.value] = count
    return dict(sorted(totals.items()))


def _glob_escape(text: str) -> str:
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)
