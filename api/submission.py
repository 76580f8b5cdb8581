"""Turning one submitted job into a queued record and a Celery message.

Validation runs in two layers: the pydantic model (types and the documented limits,
naming the field) and then `GenerationParams`, the engine's own rules, which have the
last word. Everything here is shared by `POST /v1/jobs` and `POST /v1/jobs/batch`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from api.errors import ApiError, from_params_error, from_validation_error, invalid
from api.queue import TaskQueue
from api.schemas import WEBHOOK_EVENTS, JobRequest
from api.settings import ApiSettings
from batching.params import InvalidParamsError
from batching.params import GenerationParams
from storage.errors import IdempotencyConflictError, StorageError
from storage.job_store import JobRecord, JobState, JobStore
from storage.url_policy import WebhookURLError, check_webhook_url

log = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY_CHARS = 255


@dataclass(frozen=True)
class ValidJob:
    params: GenerationParams
    deadline: float | None
    webhook_url: str | None
    webhook_events: list[str]
    request_hash: str  # identifies the body for Idempotency-Key replays


def request_hash(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def validate_job(data: Any, settings: ApiSettings, *, field_prefix: str = "") -> ValidJob:
    """Raise a 422 ApiError naming the first bad field, or return the job ready to store."""
    prefix_loc = tuple(_loc(field_prefix))
    try:
        job = JobRequest.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e, prefix_loc) from e
    try:
        params = GenerationParams.from_dict({"model": settings.default_model, **job.params_dict()})
    except InvalidParamsError as e:
        raise from_params_error(e, field_prefix) from e
    settings.limits.check(params, field_prefix)

    deadline = None
    if job.deadline is not None:
        deadline = job.deadline.timestamp()
        if deadline <= time.time():
            raise invalid(f"{field_prefix}deadline", f"{field_prefix}deadline must be in the future")

    events = list(WEBHOOK_EVENTS)
    if job.webhook_events is not None:
        if job.webhook_url is None:
            raise invalid(f"{field_prefix}webhook_events", f"{field_prefix}webhook_events needs webhook_url")
        events = [event for event in WEBHOOK_EVENTS if event in job.webhook_events]
    if job.webhook_url is not None:
        try:
            check_webhook_url(job.webhook_url, settings.webhook_allow)
        except WebhookURLError as e:
            raise invalid(f"{field_prefix}webhook_url", f"{field_prefix}webhook_url {e}") from e
    return ValidJob(params=params, deadline=deadline, webhook_url=job.webhook_url,
                    webhook_events=events if job.webhook_url else [], request_hash=request_hash(data))


def _loc(field_prefix: str) -> list[Any]:
    """`jobs[3].` -> ["jobs", 3]: the pydantic location of a batch item."""
    if not field_prefix:
        return []
    name, _, rest = field_prefix.rstrip(".").partition("[")
    return [name, int(rest.rstrip("]"))]


def check_idempotency_key(raw: str | None) -> str | None:
    if raw is None:
        return None
    if not raw or len(raw) > MAX_IDEMPOTENCY_KEY_CHARS or not raw.isascii() or not raw.isprintable():
        raise invalid("Idempotency-Key", f"the Idempotency-Key header must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} "
                                         "printable ASCII characters")
    return raw


def check_queue_room(store: JobStore, settings: ApiSettings) -> None:
    depth = store.queue_depth()
    if depth >= settings.max_queue_depth:
        raise ApiError(429, "queue_full",
                       f"{depth} jobs are queued, at the limit of {settings.max_queue_depth}; retry later",
                       headers={"Retry-After": str(settings.retry_after_seconds)})


def create_job(store: JobStore, queue: TaskQueue, tenant: str, job: ValidJob,
               idempotency_key: str | None) -> tuple[JobRecord, bool]:
    """Store the job and enqueue it. Returns (record, created); a replay is not enqueued again."""
    try:
        record, created = store.create(
            tenant=tenant, params=job.params.to_dict(), deadline=job.deadline, webhook_url=job.webhook_url,
            webhook_events=job.webhook_events, idempotency_key=idempotency_key, request_hash=job.request_hash,
        )
    except IdempotencyConflictError as e:
        raise ApiError(409, "idempotency_conflict",
                       "this Idempotency-Key was used with a different request body") from e
    if created:
        try:
            queue.enqueue_generation(record.job_id)
        except Exception as e:
            log.warning("could not enqueue job %s: %s", record.job_id, e)
            store.finish(record.job_id, JobState.FAILED, error_code="enqueue_failed",
                         error_message="the job could not be queued; submit it again")
            raise ApiError(503, "unavailable", "the job queue is unavailable; retry later",
                           headers={"Retry-After": "5"}) from e
        try:
            store.mark_sent(record.job_id)
        except StorageError as e:  # the job is queued and sent; workers will send it once more, harmlessly
            log.warning("could not mark job %s sent: %s", record.job_id, e)
    return record, created
