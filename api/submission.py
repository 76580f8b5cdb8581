"""The one submit path: every route that creates jobs (`POST /v1/jobs`, `POST /v1/jobs/batch`, the OpenAI
images routes, `POST /v1/videos`) calls `submit_jobs` (or `submit_job` for one), and only renders the outcome
in its own shape.

The sequence, written once:

1. validate each job (api.job_validation: fields, the engine's rules, the fleet, limits, webhook URL; all
   image URLs of the request fetched together, all webhook hosts looked up together), then
2. check the adapter it names (a missing or another tenant's LoRA is refused), then
3. create them: one Redis round trip, a pipeline of atomic CREATE scripts (storage.lua). Each script
   answers an idempotent replay first, then checks the queue limits and takes the tenant's rate slot, and
   only then stores the record (with its inline images) and wakes its model's workers. So a replay never
   takes a rate slot nor meets a limit, a refused job stores nothing, and concurrent submits cannot
   overshoot a quota.

Validation only reads; the create is the only write. A Redis failure on the way in becomes a 503 naming
Redis in one place, `redis_unavailable`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import g

from api.errors import ApiError
from api.image_fields import record_params, remote_image_urls
from api.job_validation import ValidJob, check_lora, check_webhooks, validate_job, webhook_url_of
from api.job_view import job_url
from api.remote_images import fetch_images
from api.resources import get_fleet, get_job_store, get_lora_store, get_settings, get_upload_store
from api.settings import ApiSettings
from storage.errors import IdempotencyConflictError, StorageError, StorageUnavailableError
from storage.job_record import JobRecord
from storage.job_store import (
    Created,
    CreateLimits,
    NewJobSpec,
    QueueFullError,
    RateLimitedError,
    TenantQueueFullError,
)


@dataclass(frozen=True)
class JobSubmit:
    """One job a request asks for."""

    body: Any  # the job's fields, as POST /v1/jobs takes them (validated here)
    idempotency_key: str | None = None
    field_prefix: str = ""  # how errors name its fields: "jobs[3]." for a batch item


@dataclass(frozen=True)
class Submitted:
    """A job the request got: created now, or an idempotent replay's earlier one."""

    record: JobRecord
    created: bool  # False: an idempotent replay
    queue_position: int | None  # its position in its queue and priority, when created now

    def headers(self) -> dict[str, str]:
        """Location, and Idempotent-Replayed on a replay."""
        headers = {"Location": job_url(self.record.job_id)}
        if not self.created:
            headers["Idempotent-Replayed"] = "true"
        return headers


def submit_job(body: Any, idempotency_key: str | None = None) -> Submitted:
    """Submit one job for the request's tenant; raise its ApiError (4xx naming the field, 409, 429, 503)."""
    outcome = submit_jobs([JobSubmit(body, idempotency_key)])[0]
    if isinstance(outcome, ApiError):
        raise outcome
    return outcome


def submit_jobs(items: list[JobSubmit], *, default_priority: str | None = None) -> list[Submitted | ApiError]:
    """Submit jobs for the request's tenant (`g.tenant`): one outcome per item, its Submitted or its own 4xx
    ApiError. A 5xx (a backing service down) is raised: no item of the request was created then."""
    settings, tenant = get_settings(), g.tenant
    fetched_images = fetch_images(
        [url for item in items for url in remote_image_urls(item.body, item.field_prefix)],
        settings.image_url_hosts,
        seconds=settings.image_url_timeout_seconds,
    )
    checked_webhooks = check_webhooks([url for item in items if (url := webhook_url_of(item.body))], settings)
    outcomes: list[Submitted | ApiError | None] = [None] * len(items)
    valid: list[tuple[int, ValidJob]] = []
    for index, item in enumerate(items):
        try:
            job = validate_job(
                item.body,
                settings,
                get_fleet(),
                tenant,
                uploads=get_upload_store(),
                field_prefix=item.field_prefix,
                default_priority=default_priority,
                fetched_images=fetched_images,
                checked_webhooks=checked_webhooks,
            )
            check_lora(job.params, tenant, get_lora_store(), item.field_prefix)
        except ApiError as e:
            if e.status >= 500:
                raise
            outcomes[index] = e
            continue
        valid.append((index, job))
    if valid:
        created = create_jobs(settings, tenant, [(job, items[index].idempotency_key) for index, job in valid])
        for (index, _), outcome in zip(valid, created):
            outcomes[index] = outcome
    assert all(outcome is not None for outcome in outcomes)
    return [outcome for outcome in outcomes if outcome is not None]


def create_jobs(
    settings: ApiSettings, tenant: str, jobs: list[tuple[ValidJob, str | None]]
) -> list[Submitted | ApiError]:
    """Store the jobs, and with each its inline input images (as uploads, in the same script: records hold
    upload ids, and a refused job stores none). One outcome per (job, idempotency key)."""
    uploads = get_upload_store()
    specs = []
    for job, key in jobs:
        params, new_uploads = record_params(job.params, job.upload_ids, tenant, uploads)
        specs.append(
            NewJobSpec(
                tenant=tenant,
                params=params,
                deadline=job.deadline,
                webhook_url=job.webhook_url,
                webhook_events=job.webhook_events,
                idempotency_key=key,
                request_hash=job.request_hash,
                priority=job.priority,
                preview_every=job.preview_every,
                complete_by=job.complete_by,
                cost=job.params.total_steps(),
                uploads=new_uploads,
                upload_ttl_seconds=uploads.ttl_seconds if uploads is not None else 0,
            )
        )
    limits = CreateLimits(
        max_queued=settings.max_queue_depth,
        tenant_max_queued=settings.tenant_max_queued,
        tenant_jobs_per_minute=settings.tenant_jobs_per_minute,
    )
    try:
        outcomes = get_job_store().create_many(specs, limits=limits)
    except StorageUnavailableError as e:
        raise redis_unavailable(e) from e
    return [api_outcome(outcome, settings) for outcome in outcomes]


def redis_unavailable(error: StorageUnavailableError) -> ApiError:
    """A submit's answer when Redis cannot take the jobs: 503 naming Redis (none of them was created)."""
    return ApiError(
        503,
        "unavailable",
        f"Redis is unavailable, so no job was created; retry later ({error})",
        headers={"Retry-After": "5"},
    )


def api_outcome(outcome: Created | StorageError, settings: ApiSettings) -> Submitted | ApiError:
    """A create's outcome as the API answers it."""
    match outcome:
        case Created():
            return Submitted(outcome.record, outcome.created, outcome.queue_position)
        case IdempotencyConflictError():
            return ApiError(409, "idempotency_conflict", "this Idempotency-Key was used with a different request body")
        case QueueFullError():
            why = f"{outcome.num_queued} jobs are queued, at the limit of {settings.max_queue_depth}"
            return too_many("queue_full", why, settings.retry_after_seconds)
        case TenantQueueFullError():
            why = (
                f"this API key's tenant has {outcome.num_queued} jobs queued, at its limit of "
                f"{settings.tenant_max_queued} (STEPWISE_TENANT_MAX_QUEUED)"
            )
            return too_many("tenant_queue_full", why, settings.retry_after_seconds)
        case RateLimitedError():
            why = (
                f"this API key's tenant submitted {settings.tenant_jobs_per_minute} jobs this minute"
                " (STEPWISE_TENANT_JOBS_PER_MINUTE)"
            )
            return too_many("rate_limited", why, max(1, int(outcome.retry_after + 0.999)))
    raise outcome


def too_many(code: str, why: str, retry_after: int) -> ApiError:
    return ApiError(429, code, f"{why}; retry later", headers={"Retry-After": str(retry_after)})
