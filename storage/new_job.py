"""Creating jobs (JobStore.create_many): what it takes, the pipelined CREATE scripts, what it gives back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import redis

from core.params import DEFAULT_MODEL
from storage import lua
from storage.errors import IdempotencyConflictError, StorageError
from storage.job_record import JobRecord, JobState, record_from_flat, record_to_hash
from storage.queue_names import DEFAULT_PRIORITY, generate_queue
from storage.redis_keys import RedisKeys
from storage.replica_wait import ReplicaWait


class QueueFullError(StorageError):
    """As many jobs are queued as the creator allows (the API's STEPWISE_MAX_QUEUE_DEPTH)."""

    def __init__(self, num_queued: int) -> None:
        super().__init__(f"{num_queued} jobs are queued")
        self.num_queued = num_queued


class TenantQueueFullError(StorageError):
    """The tenant has as many jobs queued as it may (the API's STEPWISE_TENANT_MAX_QUEUED)."""

    def __init__(self, num_queued: int) -> None:
        super().__init__(f"the tenant has {num_queued} jobs queued")
        self.num_queued = num_queued


class RateLimitedError(StorageError):
    """The tenant created as many jobs this wall-clock minute as it may (the API's STEPWISE_TENANT_JOBS_PER_MINUTE)."""

    def __init__(self, num_submitted: int, retry_after: float) -> None:
        super().__init__(f"the tenant submitted {num_submitted} jobs this minute")
        self.num_submitted = num_submitted
        self.retry_after = retry_after  # seconds until the minute ends


@dataclass(frozen=True)
class CreateLimits:
    """What a create may not go past, checked by the CREATE script itself, job by job, after an idempotent
    replay is answered: so a batch takes what fits, concurrent creates cannot overshoot, and a replay is
    never refused by a limit nor counted against one. 0: no limit."""

    max_queued: int = 0  # jobs queued in all (STEPWISE_MAX_QUEUE_DEPTH)
    tenant_max_queued: int = 0  # jobs the tenant has queued (STEPWISE_TENANT_MAX_QUEUED)
    tenant_jobs_per_minute: int = 0  # jobs the tenant creates per wall-clock minute (STEPWISE_TENANT_JOBS_PER_MINUTE)


@dataclass(frozen=True)
class NewJobSpec:
    tenant: str
    params: dict[str, Any]  # GenerationParams.to_dict(), seed drawn; params["model"] picks the queue
    deadline: float | None = None
    webhook_url: str | None = None
    webhook_events: list[str] = field(default_factory=list)
    idempotency_key: str | None = None
    request_hash: str | None = None  # identifies the request body for idempotent replays
    priority: str = DEFAULT_PRIORITY
    preview_every: int | None = None  # a preview every this many steps (0: none); None: the worker's default
    complete_by: float | None = None  # unix seconds the job should finish by (the engine schedules by it)
    cost: float | None = None  # its cost in the fair order (storage.fair_share); None: queue_cost(params)
    # input images sent inline: Redis key -> data URI (UploadStore.pending), stored by the create script only when
    # the job is created, expiring after upload_ttl_seconds
    uploads: dict[str, str] = field(default_factory=dict)
    upload_ttl_seconds: int = 0

    def new_record(self, job_id: str, now: float) -> JobRecord:
        assert self.tenant, "tenant must not be empty"
        return JobRecord(
            job_id=job_id,
            tenant=self.tenant,
            state=JobState.QUEUED,
            params=self.params,
            created_at=now,
            deadline=self.deadline,
            complete_by=self.complete_by,
            webhook_url=self.webhook_url,
            webhook_events=list(self.webhook_events),
            idempotency_key=self.idempotency_key,
            queue=generate_queue(self.params.get("model", DEFAULT_MODEL)),
            priority=self.priority,
            preview_every=self.preview_every,
        )


@dataclass(frozen=True)
class Created:
    record: JobRecord  # the new job, or the earlier one on an idempotent replay
    created: bool  # False: an idempotent replay (send no message)
    queue_position: int | None  # position among queued jobs of its model and priority, when created


def run_creates(
    client: redis.Redis,
    create_sha: str,
    keys: RedisKeys,
    pending: list[tuple[NewJobSpec, JobRecord, float]],
    limits: CreateLimits,
    minute: int,
    replica_wait: ReplicaWait,
) -> list[Any]:
    """One pipeline of CREATE scripts (storage.lua), one per pending (spec, record, fair share); their raw replies.
    `minute` is the wall-clock minute (unix seconds // 60) whose submits the rate limit counts.

    EVALSHA goes straight into the pipeline: redis-py's Script objects would add a SCRIPT EXISTS
    round trip to every pipeline. After a Redis restart or a failover (scripts gone) the script is
    loaded and the jobs that got NOSCRIPT (so did not run) run again; no job runs twice. While the
    master has replicas the pipeline ends with WAIT: the jobs are acknowledged once a replica has them
    (storage.replica_wait), else ReplicaUnconfirmedError."""
    replies: list[Any] = [None] * len(pending)
    todo = list(range(len(pending)))
    for _ in range(2):
        with client.pipeline(transaction=False) as pipe, replica_wait.forgetting_on_error():
            for index in todo:
                spec, record, share = pending[index]
                script_keys = [keys.job(record.job_id)]
                if spec.idempotency_key is not None:
                    script_keys.append(keys.idempotency(spec.tenant, spec.idempotency_key))
                flat = json.dumps([item for pair in record_to_hash(record).items() for item in pair])
                pipe.evalsha(
                    create_sha,
                    len(script_keys),
                    *script_keys,
                    keys.namespace,
                    record.job_id,
                    spec.request_hash or "",
                    limits.max_queued,
                    flat,
                    repr(share),
                    spec.upload_ttl_seconds,
                    limits.tenant_max_queued,
                    keys.submit_rate(spec.tenant, minute),
                    limits.tenant_jobs_per_minute,
                    *[item for pair in spec.uploads.items() for item in pair],
                )
            waits = replica_wait.queue_wait(pipe)
            executed = pipe.execute(raise_on_error=False)
            for index, reply in zip(todo, executed):
                replies[index] = reply
        todo = [index for index in todo if isinstance(replies[index], redis.exceptions.NoScriptError)]
        if not todo:
            break
        client.script_load(lua.CREATE)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    if waits:  # the last pipeline's WAIT: it came after every job's write
        if isinstance(executed[-1], Exception):
            raise executed[-1]
        replica_wait.check(executed[-1])
    return replies


def create_outcome(spec: NewJobSpec, record: JobRecord, reply: list, now: float) -> Created | StorageError:
    """A CREATE reply -> what became of the job (`now`: the time the rate limit's minute was taken from)."""
    if reply[0] == 1:
        return Created(record, True, int(reply[1]))
    if reply[0] == 2:
        return QueueFullError(int(reply[1]))
    if reply[0] == 3:
        return TenantQueueFullError(int(reply[1]))
    if reply[0] == 4:
        return RateLimitedError(int(reply[1]), (now // 60 + 1) * 60 - now)
    _, stored_hash, earlier = reply
    if stored_hash != (spec.request_hash or ""):
        return IdempotencyConflictError(
            f"idempotency key {spec.idempotency_key!r} was already used with a different request"
        )
    return Created(record_from_flat(earlier), False, None)
