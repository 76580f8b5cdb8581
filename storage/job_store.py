"""Job records in Redis: one hash per job, atomic state transitions, per-tenant index.

Every transition is one Lua script (see lua.py), so it is atomic and safe to repeat: nothing
leaves a terminal state, two workers cannot both take a job, and an attempt that lost its lease
cannot write as the job's holder: each attempt's holder token is `worker_id#attempt` (`JobRecord.holder`),
so not even its own worker, having taken the job again, can end it through the stale attempt. Terminal records
expire after `job_ttl_seconds`; index entries that outlive their record are dropped when a listing meets them.

`counts_by_state()` is O(1): queued and running are the sizes of the queue and lease sets (jobs
now in that state); the terminal states are totals of jobs that ever reached them, since their
records expire.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, cast

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from settings import default
from storage import lua
from storage.errors import (
    IdempotencyConflictError,
    InvalidCursorError,
    InvalidTransitionError,
    JobNotFoundError,
    JobStoringError,
    StorageError,
    StorageUnavailableError,
)
from storage.fair_share import TenantWeights, queue_cost
from storage.heartbeats import HeartbeatStore
from storage.job_events import EVENT_LOG_SECONDS
from storage.job_reads import JobReads
from storage.job_record import (
    RECORD_FIELDS,
    REQUEUE_REASONS,
    JobRecord,
    JobState,
    encode_field,
    new_job_id,
    record_from_flat,
)
from storage.new_job import (
    Created,
    CreateLimits,
    NewJobSpec,
    QueueFullError,
    RateLimitedError,
    TenantQueueFullError,
    create_outcome,
    run_creates,
)
from storage.queue_names import DEFAULT_PRIORITY
from storage.redis_clients import close_redis, describe_redis, open_redis
from storage.redis_errors import wraps_redis_errors as _wraps_redis_errors
from storage.redis_keys import RedisKeys
from storage.replica_wait import ReplicaWait
from storage.settings import StorageSettings

__all__ = [
    "CreateLimits",
    "Created",
    "NewJobSpec",
    "QueueFullError",
    "RateLimitedError",
    "TenantQueueFullError",
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
NO_LIMITS = CreateLimits()


class JobStore(JobReads):
    def __init__(
        self,
        redis_url: str,
        *,
        job_ttl_seconds: int = 7 * 24 * 3600,
        namespace: str = "stepwise",
        clock: Callable[[], float] = time.time,
        worker_timeout: float = 10.0,
        model_retention: float = 3600.0,
        tenant_weights: TenantWeights | None = None,
        replica_wait_seconds: float = default("STEPWISE_REDIS_REPLICA_WAIT"),
    ) -> None:
        self.job_ttl_seconds = job_ttl_seconds
        self.namespace = namespace
        self.keys = RedisKeys(namespace)
        self.clock = clock
        self.tenant_weights = tenant_weights or TenantWeights()  # the fair order's weights (storage.fair_share)
        # Short timeouts and few reconnect attempts: a Redis outage should reach the API as a
        # quick 503, not as a request hanging for half a minute. A blocking pool: a burst of more
        # concurrent callers than connections (app threads) waits for one, where
        # redis-py's default pool would fail the call ("Too many connections").
        # With Sentinel, a connection finds the master through the sentinels (storage.redis_clients).
        self._redis = open_redis(
            redis_url,
            max_connections=MAX_CONNECTIONS,
            pool_timeout=5,
            decode_responses=True,
            socket_connect_timeout=2,
            socket_timeout=5,
            retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries=2),
        )
        self.redis_location = describe_redis(redis_url)
        # Creates, cancels and deletes are acknowledged once a replica has them (storage.replica_wait).
        self.replica_wait = ReplicaWait(self._redis, replica_wait_seconds)
        self._heartbeats = HeartbeatStore(
            self._redis, self.keys, worker_timeout=worker_timeout, retention=model_retention
        )
        register = self._redis.register_script
        self._create = register(lua.CREATE)
        self._take_next = register(lua.TAKE_NEXT)
        self._renew_lease = register(lua.RENEW_LEASE)
        self._set_progress = register(lua.SET_PROGRESS)
        self._add_preview = register(lua.ADD_PREVIEW)
        self._finish = register(lua.FINISH)
        self._request_cancel = register(lua.REQUEST_CANCEL)
        self._release = register(lua.RELEASE)
        self._add_webhook_attempt = register(lua.ADD_WEBHOOK_ATTEMPT)
        self._delete = register(lua.DELETE)
        self._set_storing = register(lua.SET_STORING)
        self._adopt = register(lua.ADOPT)

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
            tenant_weights=settings.tenant_weights,
            replica_wait_seconds=settings.redis_replica_wait,
        )

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
        complete_by: float | None = None,
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
            complete_by=complete_by,
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
        limits: CreateLimits = NO_LIMITS,
    ) -> list[Created | StorageError]:
        """Create queued jobs in one round trip (a pipeline of atomic scripts, run in order), each waking its
        queue's workers in the same script (`wait_for_work`).

        One outcome per spec: `Created` (a new job, or an idempotent replay's earlier one), or the error for
        that job: IdempotencyConflictError, or the limit it met (QueueFullError, TenantQueueFullError,
        RateLimitedError: `CreateLimits`)."""
        now = self.clock()
        pending = [
            (
                spec,
                spec.new_record(new_job_id(), now),
                self.tenant_weights.share(spec.tenant, queue_cost(spec.params) if spec.cost is None else spec.cost),
            )
            for spec in specs
        ]
        replies = run_creates(
            self._redis, self._create.sha, self.keys, pending, limits, int(now // 60), self.replica_wait
        )
        return [create_outcome(spec, record, reply, now) for (spec, record, _), reply in zip(pending, replies)]

    @_wraps_redis_errors
    def wait_for_work(self, queue: str, timeout: float) -> bool:
        """Block until a job is queued on `queue` (a wake-up token, pushed by the script that queued it) or
        `timeout` seconds pass; True if woken. A token is one wake-up: each wakes one waiting worker."""
        return self._redis.blpop([self.keys.wake(queue)], timeout=timeout) is not None

    @_wraps_redis_errors
    def take_next(self, queue: str, worker_id: str, lease_seconds: int) -> JobRecord | None:
        """What a worker's feeder does when its engine has room: atomically take the next job of `queue`
        (highest priority first, then the fair order: storage.fair_share) queued -> running with a lease. None
        if no job of that queue is queued."""
        now = self.clock()
        reply = self._take_next(args=[self.namespace, queue, worker_id, repr(now), repr(now + lease_seconds)])
        return record_from_flat(reply) if reply else None

    @_wraps_redis_errors
    def renew_lease(self, job_id: str, holder: str, lease_seconds: int) -> bool:
        """Extend the lease of a job `holder` (an attempt: `JobRecord.holder`) holds; False if it no longer holds it."""
        expires_at = self.clock() + lease_seconds
        return (
            self._renew_lease(keys=[self.job_key(job_id)], args=[self.namespace, job_id, holder, repr(expires_at)]) == 1
        )

    @_wraps_redis_errors
    def set_progress(
        self,
        job_id: str,
        step: int,
        total: int,
        *,
        current_image: int = 0,
        is_paused: bool = False,
        is_late: bool = False,
    ) -> None:
        """A running job's progress (in its own steps; `current_image`: the image it is on while its images run
        one after another, else 0), and whether its engine has it paused or estimates it late."""
        flags = ["1" if is_paused else "0", "1" if is_late else "0"]
        args: list[str | int] = [self.namespace, job_id, int(step), int(total), *flags, int(current_image)]
        self._set_progress(keys=[self.job_key(job_id)], args=args)

    @_wraps_redis_errors
    def add_preview(self, job_id: str, step: int, total: int, image: str) -> None:
        """Put a running job's preview (a data URI) on its event stream (storage.job_events)."""
        self._add_preview(keys=[self.job_key(job_id)], args=[self.namespace, job_id, int(step), int(total), image])

    @_wraps_redis_errors
    def set_storing(self, job_id: str, holder: str, reason: str) -> bool:
        """A running job `holder` holds has its images made but kept in the worker's spool, because the image
        store failed with `reason` (worker.spool); it stays running until they are stored. False if that attempt
        no longer holds it."""
        args = [self.namespace, job_id, holder, repr(self.clock()), reason]
        return self._set_storing(keys=[self.job_key(job_id)], args=args) == 1

    @_wraps_redis_errors
    def adopt(self, job_id: str, from_holder: str, worker_id: str, lease_seconds: int) -> JobRecord | None:
        """Take over a job whose images wait in a stopped worker's spool: still held by the attempt that spooled it,
        `from_holder` (whatever its lease) -> held by `worker_id` (the same attempt) with a fresh lease. None if that
        attempt no longer holds it (it ended, or went back to the queue and may run elsewhere)."""
        now = self.clock()
        args = [self.namespace, job_id, from_holder, worker_id, repr(now), repr(now + lease_seconds)]
        reply = self._adopt(keys=[self.job_key(job_id)], args=args)
        return record_from_flat(reply) if reply else None

    @_wraps_redis_errors
    def finish(self, job_id: str, state: JobState, *, holder: str | None = None, **fields: Any) -> bool:
        """Atomically move a non-terminal job to a terminal state with extra fields (image_keys,
        timings, error_code, error_message). Refused (False) if already terminal, or, when
        `holder` (an attempt: `JobRecord.holder`) is given, if that attempt does not hold the job now."""
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
                holder or "",
                len(to_set),
                *to_set,
                *to_delete,
            ],
        )
        return reply == 1

    @_wraps_redis_errors
    def request_cancel(self, job_id: str) -> JobState:
        """Queued -> canceled at once; running -> cancel_requested flag (the worker stops it at the
        next step boundary). Raises InvalidTransitionError if terminal, JobStoringError if its images are
        made and wait in its worker's spool (nothing is left to stop), JobNotFoundError if there is no such
        job. Returns the new state."""
        args = [self.namespace, job_id, repr(self.clock()), self.job_ttl_seconds]
        outcome, state = self.replica_wait.run_script(self._request_cancel, [self.job_key(job_id)], args)
        if outcome == "missing":
            raise JobNotFoundError(f"no job {job_id!r}")
        if outcome == "refused":
            raise InvalidTransitionError(f"job {job_id!r} is already {state}; it cannot be canceled")
        if outcome == "storing":
            raise JobStoringError(f"job {job_id!r} has made its images; they wait for the image store")
        return JobState(state)

    @_wraps_redis_errors
    def release(self, job_id: str, holder: str, reason: str = "worker_shutdown", message: str = "") -> bool:
        """Running -> queued again (warm shutdown, drain, or a dead holder), at the head of its queue, waking its
        queue's workers. Attempts and the first started_at are kept, progress restarts, and the record says why
        (`reason`, one of REQUEUE_REASONS, and `message`). False if the attempt `holder` does not hold the job
        (so two callers cannot both re-queue it), or if a cancel was requested: then the job becomes
        canceled and must not be queued again."""
        assert reason in REQUEUE_REASONS, reason
        return self._release_script(job_id, holder=holder, lapsed_at=None, reason=reason, message=message) == 1

    @_wraps_redis_errors
    def release_if_lapsed(self, job_id: str, now: float | None = None) -> bool:
        """Release a running job only if its lease is still lapsed at `now` (whoever held it), so a
        reaper cannot take a job away from a worker that renewed its lease in the meantime."""
        now = self.clock() if now is None else now
        message = "its worker stopped renewing the job's lease"
        return self._release_script(job_id, holder=None, lapsed_at=now, reason="lease_expired", message=message) == 1

    def _release_script(
        self, job_id: str, *, holder: str | None, lapsed_at: float | None, reason: str, message: str
    ) -> int:
        lapsed = "" if lapsed_at is None else repr(lapsed_at)
        args: list[str | int] = [self.namespace, job_id, holder or "", repr(self.clock()), self.job_ttl_seconds]
        return self._release(keys=[self.job_key(job_id)], args=[*args, lapsed, reason, message])

    @_wraps_redis_errors
    def delete(self, job_id: str, tombstone_seconds: int) -> JobState | None:
        """Remove the job's record, indexes and idempotency key; a queued job is canceled first. Returns its
        state before, or None if there is no such job. A worker still running it finds the record gone and
        `was_deleted` true for `tombstone_seconds`, and removes the images it stored meanwhile."""
        now = self.clock()
        args = [self.namespace, job_id, repr(now), self.job_ttl_seconds, tombstone_seconds]
        outcome, state = self.replica_wait.run_script(self._delete, [self.job_key(job_id)], args)
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
        close_redis(self._redis)

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
