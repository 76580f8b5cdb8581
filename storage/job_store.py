"""Job records in Redis: one hash per job, atomic state transitions, per-tenant index.

Every transition is one Lua script (see lua.py), so it is atomic and safe to repeat: nothing
leaves a terminal state, two workers cannot both take a job, and a worker that lost its lease
cannot finish a job another worker now holds. Terminal records expire after
`job_ttl_seconds`; index entries that outlive their record are dropped when a listing meets them.

`counts_by_state()` is O(1): queued and running are the sizes of the queue and lease sets (jobs
now in that state); the terminal states are totals of jobs that ever reached them, since their
records expire.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from batching.params import PRIORITIES
from storage import lua
from storage.errors import (
    IdempotencyConflictError,
    InvalidCursorError,
    InvalidTransitionError,
    JobNotFoundError,
    StorageError,
    StorageUnavailableError,
)
from storage.heartbeats import Heartbeat, HeartbeatStore, ModelStatus
from storage.job_events import EVENT_LOG_SECONDS
from storage.job_record import (
    RECORD_FIELDS,
    REQUEUE_REASONS,
    TERMINAL_STATES,
    JobRecord,
    JobState,
    encode_field,
    record_from_flat,
    record_from_hash,
)
from storage.new_job import Created, NewJobSpec, QueueFullError, create_outcome, run_creates
from storage.queues import DEFAULT_PRIORITY
from storage.redis_keys import RedisKeys
from storage.settings import StorageSettings
from storage.tenant_listing import decode_cursor, encode_cursor, iter_tenant_records, tenant_totals

__all__ = [
    "Created",
    "NewJobSpec",
    "QueueFullError",
    "IdempotencyConflictError",
    "InvalidCursorError",
    "InvalidTransitionError",
    "JobNotFoundError",
    "JobRecord",
    "JobState",
    "JobStore",
    "StorageError",
    "StorageUnavailableError",
]

# Fields that finish() may set; the rest belong to the store's own transitions.
FINISH_FIELDS = RECORD_FIELDS - {
    "job_id",
    "tenant",
    "state",
    "created_at",
    "finished_at",
    "attempts",
    "worker_id",
    "lease_expires_at",
    "idempotency_key",
    "queued_seconds",
    "requeued_at",
    "requeue_reason",
    "requeue_message",
}
MAX_CONNECTIONS = 100  # per process, as redis-py's default pool
_UNAVAILABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ReadOnlyError,
)


def _wraps_redis_errors(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapper(self: JobStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except _UNAVAILABLE as e:
            raise StorageUnavailableError(f"Redis at {self.redis_location} is unavailable: {e}") from e
        except redis.exceptions.RedisError as e:
            raise StorageError(f"Redis error in JobStore.{method.__name__}: {e}") from e

    return wrapper


class JobStore:
    def __init__(
        self,
        redis_url: str,
        *,
        job_ttl_seconds: int = 7 * 24 * 3600,
        namespace: str = "stepwise",
        clock: Callable[[], float] = time.time,
        worker_timeout: float = 10.0,
        model_retention: float = 3600.0,
    ) -> None:
        self.job_ttl_seconds = job_ttl_seconds
        self.namespace = namespace
        self.keys = RedisKeys(namespace)
        self.clock = clock
        # Short timeouts and few reconnect attempts: a Redis outage should reach the API as a
        # quick 503, not as a request hanging for half a minute. A blocking pool: a burst of more
        # concurrent callers than connections (greenlets under gevent) waits for one, where
        # redis-py's default pool would fail the call ("Too many connections").
        pool = redis.BlockingConnectionPool.from_url(
            redis_url,
            max_connections=MAX_CONNECTIONS,
            timeout=5,
            decode_responses=True,
            socket_connect_timeout=2,
            socket_timeout=5,
            retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries=2),
        )
        self._redis = redis.Redis(connection_pool=pool)
        kwargs = self._redis.get_connection_kwargs()
        self.redis_location = f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
        self._heartbeats = HeartbeatStore(
            self._redis, self.keys.workers, worker_timeout=worker_timeout, retention=model_retention
        )
        register = self._redis.register_script
        self._create = register(lua.CREATE)
        self._take = register(lua.TAKE)
        self._renew_lease = register(lua.RENEW_LEASE)
        self._set_progress = register(lua.SET_PROGRESS)
        self._add_preview = register(lua.ADD_PREVIEW)
        self._finish = register(lua.FINISH)
        self._request_cancel = register(lua.REQUEST_CANCEL)
        self._release = register(lua.RELEASE)
        self._add_webhook_attempt = register(lua.ADD_WEBHOOK_ATTEMPT)
        self._delete = register(lua.DELETE)

    @property
    def redis(self) -> redis.Redis:
        """The client, for stores that live beside the records (storage.upload_store)."""
        return self._redis

    @classmethod
    def from_settings(cls, settings: StorageSettings) -> JobStore:
        return cls(
            settings.redis_url,
            job_ttl_seconds=settings.job_ttl_seconds,
            worker_timeout=settings.worker_timeout,
            model_retention=settings.model_retention,
        )

    def job_key(self, job_id: str) -> str:
        return self.keys.job(job_id)

    # Reads.

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
        self, tenant: str, *, state: JobState | None = None, limit: int = 20, cursor: str | None = None
    ) -> tuple[list[JobRecord], str | None]:
        """Newest first; returns (records, next_cursor or None)."""
        assert limit > 0
        state = JobState(state) if state is not None else None
        after = decode_cursor(cursor) if cursor else None
        records: list[tuple[float, JobRecord]] = []
        for score, record in iter_tenant_records(self._redis, self.keys, tenant, state, after):
            records.append((score, record))
            if len(records) > limit:
                break
        if len(records) <= limit:
            return [record for _, record in records], None
        last_score, last_record = records[limit - 1]
        return [record for _, record in records[:limit]], encode_cursor(last_score, last_record.job_id)

    @_wraps_redis_errors
    def queue_position(self, record: JobRecord) -> int | None:
        """0-based position among queued jobs of its model and priority (oldest first); None if not queued."""
        return cast(int | None, self._redis.zrank(self.keys.queue_of(record), record.job_id))  # no withscore: a rank

    @_wraps_redis_errors
    def queue_positions(self, records: list[JobRecord]) -> list[int | None]:
        """queue_position of each record, in one round trip (non-queued records: None)."""
        with self._redis.pipeline(transaction=False) as pipe:
            for record in records:
                pipe.zrank(self.keys.queue_of(record), record.job_id)
            ranks = pipe.execute()
        return [rank if record.state is JobState.QUEUED else None for record, rank in zip(records, ranks)]

    @_wraps_redis_errors
    def queued_by_priority(self, queue: str) -> dict[str, int]:
        """Jobs queued in one model's queue, per priority."""
        with self._redis.pipeline(transaction=False) as pipe:
            for priority in PRIORITIES:
                pipe.zcard(self.keys.queued_in(queue, priority))
            return dict(zip(PRIORITIES, pipe.execute()))

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
    def reserve_submit_slot(self, tenant: str, per_minute: int) -> float | None:
        """Count one submission against the tenant's fixed one-minute window. Returns None when it
        fits, else the seconds until the window ends (the slot is given back)."""
        now = self.clock()
        window = int(now // 60)
        key = self.keys.submit_rate(tenant, window)
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, 120)
            count, _ = pipe.execute()
        if count <= per_minute:
            return None
        self._redis.decr(key)
        return (window + 1) * 60 - now

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

    # Transitions.

    @_wraps_redis_errors
    def create(
        self,
        *,
        tenant: str,
        params: dict[str, Any],
        deadline: float | None = None,
        webhook_url: str | None = None,
        webhook_events: list[str] | None = None,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
        priority: str = DEFAULT_PRIORITY,
    ) -> tuple[JobRecord, bool]:
        """Create a queued job. Returns (record, created). Same tenant+idempotency_key with the
        same request_hash returns the original (created=False); a different hash raises
        IdempotencyConflictError."""
        spec = NewJobSpec(
            tenant=tenant,
            params=params,
            deadline=deadline,
            webhook_url=webhook_url,
            webhook_events=list(webhook_events or []),
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            priority=priority,
        )
        outcome = self.create_many([spec])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome.record, outcome.created

    @_wraps_redis_errors
    def create_many(
        self,
        specs: list[NewJobSpec],
        *,
        max_queued: int = 0,
        message_for: Callable[[JobRecord], tuple[str, str]] | None = None,
    ) -> list[Created | StorageError]:
        """Create queued jobs in one round trip (a pipeline of atomic scripts, run in order).

        One outcome per spec: `Created`, or the error for that job (IdempotencyConflictError, or
        QueueFullError once `max_queued` jobs are queued; 0 means no limit). `message_for(record)`
        gives (Redis list, payload) of the job's broker message, pushed atomically with the record
        (without it no message is sent: for callers that run the job's task themselves)."""
        pending = [(spec, spec.new_record(uuid.uuid4().hex, self.clock())) for spec in specs]
        replies = run_creates(self._redis, self._create.sha, self.keys, pending, max_queued, message_for)
        return [create_outcome(spec, record, reply) for (spec, record), reply in zip(pending, replies)]

    @_wraps_redis_errors
    def take(self, job_id: str, worker_id: str, lease_seconds: int) -> JobRecord | None:
        """Atomically queued -> running (attempts+1, started_at, lease). None if the job is not
        queued (terminal, or another worker holds it)."""
        now = self.clock()
        reply = self._take(
            keys=[self.job_key(job_id)], args=[self.namespace, job_id, worker_id, repr(now), repr(now + lease_seconds)]
        )
        return record_from_flat(reply) if reply else None

    @_wraps_redis_errors
    def renew_lease(self, job_id: str, worker_id: str, lease_seconds: int) -> bool:
        """Extend the lease of a job this worker holds; False if it no longer holds it."""
        expires_at = self.clock() + lease_seconds
        return (
            self._renew_lease(keys=[self.job_key(job_id)], args=[self.namespace, job_id, worker_id, repr(expires_at)])
            == 1
        )

    @_wraps_redis_errors
    def set_progress(self, job_id: str, step: int, total: int) -> None:
        self._set_progress(keys=[self.job_key(job_id)], args=[self.namespace, job_id, int(step), int(total)])

    @_wraps_redis_errors
    def add_preview(self, job_id: str, step: int, total: int, image: str) -> None:
        """Put a running job's preview (a data URI) on its event stream (storage.job_events)."""
        self._add_preview(keys=[self.job_key(job_id)], args=[self.namespace, job_id, int(step), int(total), image])

    @_wraps_redis_errors
    def finish(self, job_id: str, state: JobState, *, worker_id: str | None = None, **fields: Any) -> bool:
        """Atomically move a non-terminal job to a terminal state with extra fields (image_keys,
        timings, error_code, error_message). Refused (False) if already terminal, or, when
        worker_id is given, if that worker does not hold the job now."""
        state = JobState(state)
        if not state.is_terminal:
            raise ValueError(f"finish() needs a terminal state, got {state.value!r}")
        unknown = set(fields) - FINISH_FIELDS
        if unknown:
            raise ValueError(f"finish() cannot set {sorted(unknown)}; allowed: {sorted(FINISH_FIELDS)}")
        encoded = {name: encode_field(name, value) for name, value in fields.items()}
        to_set = [item for name, value in encoded.items() if value is not None for item in (name, value)]
        to_delete = [name for name, value in encoded.items() if value is None]
        reply = self._finish(
            keys=[self.job_key(job_id)],
            args=[
                self.namespace,
                job_id,
                state.value,
                repr(self.clock()),
                self.job_ttl_seconds,
                worker_id or "",
                len(to_set),
                *to_set,
                *to_delete,
            ],
        )
        return reply == 1

    @_wraps_redis_errors
    def request_cancel(self, job_id: str) -> JobState:
        """Queued -> canceled at once; running -> cancel_requested flag (the worker stops it at the
        next step boundary). Raises InvalidTransitionError if terminal, JobNotFoundError if there is
        no such job. Returns the new state."""
        outcome, state = self._request_cancel(
            keys=[self.job_key(job_id)], args=[self.namespace, job_id, repr(self.clock()), self.job_ttl_seconds]
        )
        if outcome == "missing":
            raise JobNotFoundError(f"no job {job_id!r}")
        if outcome == "refused":
            raise InvalidTransitionError(f"job {job_id!r} is already {state}; it cannot be canceled")
        return JobState(state)

    @_wraps_redis_errors
    def release(self, job_id: str, worker_id: str, reason: str = "worker_shutdown", message: str = "") -> bool:
        """Running -> queued again (warm shutdown, drain, or a dead holder); the caller re-enqueues it.
        Attempts and the first started_at are kept, progress restarts, and the record says why
        (`reason`, one of REQUEUE_REASONS, and `message`). False if `worker_id` does not hold the job
        (so two callers cannot both re-queue it), or if a cancel was requested: then the job becomes
        canceled and must not be re-enqueued."""
        assert reason in REQUEUE_REASONS, reason
        return self._release_script(job_id, worker_id=worker_id, lapsed_at=None, reason=reason, message=message) == 1

    @_wraps_redis_errors
    def release_if_lapsed(self, job_id: str, now: float | None = None) -> bool:
        """Release a running job only if its lease is still lapsed at `now` (whoever held it), so a
        reaper cannot take a job away from a worker that renewed its lease in the meantime."""
        now = self.clock() if now is None else now
        message = "its worker stopped renewing the job's lease"
        return self._release_script(job_id, worker_id=None, lapsed_at=now, reason="lease_expired", message=message) == 1

    def _release_script(
        self, job_id: str, *, worker_id: str | None, lapsed_at: float | None, reason: str, message: str
    ) -> int:
        lapsed = "" if lapsed_at is None else repr(lapsed_at)
        args: list[str | int] = [self.namespace, job_id, worker_id or "", repr(self.clock()), self.job_ttl_seconds]
        return self._release(keys=[self.job_key(job_id)], args=[*args, lapsed, reason, message])

    @_wraps_redis_errors
    def delete(self, job_id: str, tombstone_seconds: int) -> JobState | None:
        """Remove the job's record, indexes and idempotency key; a queued job is canceled first. Returns its
        state before, or None if there is no such job. A worker still running it finds the record gone and
        `was_deleted` true for `tombstone_seconds`, and removes the images it stored meanwhile."""
        now = self.clock()
        outcome, state = self._delete(
            keys=[self.job_key(job_id)],
            args=[self.namespace, job_id, repr(now), self.job_ttl_seconds, tombstone_seconds],
        )
        return JobState(state) if outcome == "deleted" else None

    @_wraps_redis_errors
    def was_deleted(self, job_id: str) -> bool:
        return bool(self._redis.exists(self.keys.deleted(job_id)))

    @property
    def heartbeat_store(self) -> HeartbeatStore:
        """The workers' heartbeats, on this store's Redis (worker.dead_workers reads them)."""
        return self._heartbeats

    @_wraps_redis_errors
    def add_webhook_attempt(self, job_id: str, attempt: dict[str, Any]) -> None:
        attempt_json = json.dumps(attempt, separators=(",", ":"), sort_keys=True)
        self._add_webhook_attempt(keys=[self.job_key(job_id)], args=[self.namespace, attempt_json])

    @_wraps_redis_errors
    def set_latest_progress_webhook(self, job_id: str, webhook_id: str) -> None:
        """The job's newest progress webhook; deliveries of older ones are dropped (worker.webhooks)."""
        self._redis.set(self.keys.progress_webhook(job_id), webhook_id, ex=EVENT_LOG_SECONDS)

    @_wraps_redis_errors
    def latest_progress_webhook(self, job_id: str) -> str | None:
        return cast(str | None, self._redis.get(self.keys.progress_webhook(job_id)))

    def close(self) -> None:
        self._redis.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
