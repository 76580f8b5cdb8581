"""The job store's reads: one record, a tenant's listing, queue positions and depths, the served models,
counts. `JobStore` (storage.job_store) inherits them; they read the Redis keys it writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis

from core.params import PRIORITIES
from storage.heartbeats import Heartbeat, HeartbeatStore, ModelStatus
from storage.job_record import TERMINAL_STATES, JobRecord, JobState, record_from_hash
from storage.redis_errors import wraps_redis_errors as _wraps_redis_errors
from storage.redis_keys import RedisKeys
from storage.tenant_listing import decode_cursor, encode_cursor, iter_tenant_records, tenant_totals


@dataclass(frozen=True)
class ModelLoad:
    num_queued: int  # jobs waiting in the model's queue, over all priorities
    num_running: int  # jobs a worker holds now (their leases), paused ones included

    @property
    def num_jobs(self) -> int:
        return self.num_queued + self.num_running


class JobReads:
    _redis: redis.Redis
    keys: RedisKeys
    clock: Callable[[], float]
    _heartbeats: HeartbeatStore
    redis_location: str

    def job_key(self, job_id: str) -> str:
        return self.keys.job(job_id)

    def ping(self) -> bool:
        try:
            return bool(self._redis.ping())
        except redis.exceptions.RedisError:
            return False

    @_wraps_redis_errors
    def get(self, job_id: str) -> JobRecord | None:
        mapping = cast(dict[str, str], self._redis.hgetall(self.job_key(job_id)))  # decode_responses=True
        return record_from_hash(mapping) if mapping else None

    @_wraps_redis_errors
    def list_for_tenant(
        self,
        tenant: str,
        *,
        state: JobState | None = None,
        limit: int = 20,
        cursor: str | None = None,
        keep: Callable[[JobRecord], bool] | None = None,
    ) -> tuple[list[JobRecord], str | None]:
        """Newest first, only the records `keep` keeps (the video routes' videos); returns (records, next_cursor
        or None)."""
        assert limit > 0
        state = JobState(state) if state is not None else None
        after = decode_cursor(cursor) if cursor else None
        records: list[tuple[float, JobRecord]] = []
        for score, record in iter_tenant_records(self._redis, self.keys, tenant, state, after):
            if keep is not None and not keep(record):
                continue
            records.append((score, record))
            if len(records) > limit:
                break
        if len(records) <= limit:
            return [record for _, record in records], None
        last_score, last_record = records[limit - 1]
        return [record for _, record in records[:limit]], encode_cursor(last_score, last_record.job_id)

    @_wraps_redis_errors
    def queue_position(self, record: JobRecord) -> int | None:
        """0-based position among queued jobs of its model and priority in the order workers take them
        (storage.fair_share); None if not queued."""
        return cast(int | None, self._redis.zrank(self.keys.queue_of(record), record.job_id))  # no withscore: a rank

    @_wraps_redis_errors
    def queue_positions(self, records: list[JobRecord]) -> list[int | None]:
        """queue_position of each record, in one round trip and at one instant (MULTI), so positions read
        together are consistent with each other. Each job's state is read in the same instant, not taken from
        its record: a record read as running just before its job was re-queued gets its position (None for a
        job not queued then)."""
        with self._redis.pipeline(transaction=True) as pipe:
            for record in records:
                pipe.hget(self.job_key(record.job_id), "state")
                pipe.zrank(self.keys.queue_of(record), record.job_id)
            replies = pipe.execute()
        states, ranks = replies[0::2], replies[1::2]
        return [rank if state == JobState.QUEUED.value else None for state, rank in zip(states, ranks)]

    @_wraps_redis_errors
    def queued_by_priority(self, queue: str) -> dict[str, int]:
        """Jobs queued in one model's queue, per priority."""
        with self._redis.pipeline(transaction=False) as pipe:
            for priority in PRIORITIES:
                pipe.zcard(self.keys.queued_in(queue, priority))
            return dict(zip(PRIORITIES, pipe.execute()))

    @_wraps_redis_errors
    def model_load(self, queue: str) -> ModelLoad:
        """One model's work now: its jobs queued (every priority) and running (holding a lease, paused ones
        too). What an autoscaler reads to size the model's workers (GET /v1/admin/scaling): zero when idle."""
        with self._redis.pipeline(transaction=True) as pipe:
            for priority in PRIORITIES:
                pipe.zcard(self.keys.queued_in(queue, priority))
            pipe.zrange(self.keys.leases, 0, -1)
            *depths, running_ids = pipe.execute()
        with self._redis.pipeline(transaction=False) as pipe:
            for job_id in running_ids:
                pipe.hget(self.job_key(job_id), "queue")
            running_queues = pipe.execute()
        return ModelLoad(num_queued=sum(depths), num_running=running_queues.count(queue))

    @_wraps_redis_errors
    def queue_depth(self) -> int:
        return self._redis.zcard(self.keys.queued)

    @_wraps_redis_errors
    def beat(self, heartbeat: Heartbeat) -> None:
        """Record a worker's heartbeat (storage.heartbeats)."""
        self._heartbeats.beat(heartbeat)

    @_wraps_redis_errors
    def models(self) -> list[ModelStatus]:
        """The models workers served within the retention, with their queue depths."""
        statuses = self._heartbeats.models(self.clock())
        with self._redis.pipeline(transaction=False) as pipe:
            for status in statuses:
                for priority in PRIORITIES:
                    pipe.zcard(self.keys.queued_in(status.queue, priority))
            depths = pipe.execute()
        for index, status in enumerate(statuses):
            status.queued_by_priority = dict(zip(PRIORITIES, depths[index * len(PRIORITIES) :]))
        return statuses

    @_wraps_redis_errors
    def tenant_queue_depth(self, tenant: str) -> int:
        """The tenant's queued jobs (its per-state index moves with every transition)."""
        return self._redis.zcard(self.keys.tenant_index(tenant, JobState.QUEUED))

    @_wraps_redis_errors
    def tenant_totals(self) -> dict[str, dict[str, int]]:
        """tenant -> its queued and running jobs now (storage.tenant_listing.tenant_totals)."""
        return tenant_totals(self._redis, self.keys)

    @_wraps_redis_errors
    def counts_by_state(self) -> dict[str, int]:
        """Queued and running: jobs in that state now. Terminal states: jobs that ever reached them."""
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.zcard(self.keys.queued)
            pipe.zcard(self.keys.leases)
            pipe.hgetall(self.keys.finished_counts)
            num_queued, num_running, finished = pipe.execute()
        counts = {JobState.QUEUED.value: num_queued, JobState.RUNNING.value: num_running}
        for state in TERMINAL_STATES:
            counts[state.value] = int(finished.get(state.value, 0))
        return counts

    @_wraps_redis_errors
    def is_cancel_requested(self, job_id: str) -> bool:
        """True once a cancel was requested while the job ran, if it is canceled by now, or deleted."""
        state, flag = self._redis.hmget(self.job_key(job_id), "state", "cancel_requested")
        return flag == "1" or state in (JobState.CANCELED.value, None)

    @_wraps_redis_errors
    def lapsed_job_ids(self, now: float | None = None) -> list[str]:
        """Running jobs whose lease expired."""
        now = self.clock() if now is None else now
        return cast(list[str], self._redis.zrangebyscore(self.keys.leases, "-inf", repr(now)))  # decode_responses
