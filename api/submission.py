"""Turning one submitted job into a queued record and a Celery message.

Validation runs in three layers: the pydantic model (types and the documented limits,
naming the field), `GenerationParams` (the engine's own rules), and the fleet (a worker
serves the model, and its family supports the fields). Everything here is shared by
`POST /v1/jobs` and `POST /v1/jobs/batch`.

Creating jobs is one Redis round trip whatever their number: a pipeline of atomic scripts,
each storing one record and pushing its Celery message together (`api.messages`,
`storage.lua.CREATE`), so no job exists without its message and no message without its record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from api.errors import ApiError, from_params_error, from_validation_error, invalid
from api.fleet import Fleet
from api.queue import TaskQueue
from api.schemas import WEBHOOK_EVENTS, JobRequest
from api.settings import ApiSettings
from batching.params import PRIORITIES, GenerationParams, InvalidParamsError
from storage.errors import IdempotencyConflictError, StorageError
from storage.job_store import Created, JobStore, NewJobSpec, QueueFullError
from storage.queues import DEFAULT_PRIORITY
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
    priority: str


def request_hash(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def validate_job(data: Any, settings: ApiSettings, fleet: Fleet, tenant: str, *, field_prefix: str = "",
                 default_priority: str | None = None) -> ValidJob:
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
    fleet.check_job(params, field_prefix)
    settings.limits.check(params, field_prefix)
    priority = job.priority or default_priority or DEFAULT_PRIORITY
    allowed = settings.max_priority(tenant)
    if PRIORITIES.index(priority) < PRIORITIES.index(allowed):
        raise invalid(f"{field_prefix}priority", f"{field_prefix}priority: this API key may use at most {allowed!r}")

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
                    webhook_events=events if job.webhook_url else [], request_hash=request_hash(data),
                    priority=priority)


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


PARAM_NAMES = tuple(f.name for f in dataclasses.fields(GenerationParams))


def params_dict(params: GenerationParams) -> dict[str, Any]:
    """GenerationParams.to_dict() without dataclasses.asdict's deep copy (every field is a plain value)."""
    return {name: getattr(params, name) for name in PARAM_NAMES}


def queue_full(settings: ApiSettings, num_queued: int) -> ApiError:
    return ApiError(429, "queue_full",
                    f"{num_queued} jobs are queued, at the limit of {settings.max_queue_depth}; retry later",
                    headers={"Retry-After": str(settings.retry_after_seconds)})


def create_jobs(store: JobStore, queue: TaskQueue, settings: ApiSettings, tenant: str,
                jobs: list[tuple[ValidJob, str | None]]) -> list[Created | ApiError]:
    """Store the jobs with their messages. One outcome per (job, idempotency key): Created (an
    idempotent replay is not sent again) or the item's ApiError (409, 429)."""
    specs = [NewJobSpec(tenant=tenant, params=params_dict(job.params), deadline=job.deadline, webhook_url=job.webhook_url,
                        webhook_events=job.webhook_events, idempotency_key=key, request_hash=job.request_hash,
                        priority=job.priority) for job, key in jobs]
    outcomes = store.create_many(specs, max_queued=settings.max_queue_depth,
                                 message_for=queue.generate_messages.for_record)
    return [_api_outcome(outcome, settings) for outcome in outcomes]


def _api_outcome(outcome: Created | StorageError, settings: ApiSettings) -> Created | ApiError:
    if isinstance(outcome, Created):
        return outcome
    if isinstance(outcome, IdempotencyConflictError):
        return ApiError(409, "idempotency_conflict", "this Idempotency-Key was used with a different request body")
    if isinstance(outcome, QueueFullError):
        return queue_full(settings, outcome.num_queued)
    raise outcome
