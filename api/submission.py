"""Turning one submitted job into a queued record and a Celery message.

Validation runs in three layers: the pydantic model (types and the documented limits,
naming the field), `GenerationParams` (the engine's own rules), and the fleet (a worker
serves the model, and its family supports the fields). It only reads: an inline or fetched
input image is stored as an upload by the script that creates its job, in the same step, so a job
refused anywhere (validation, a 409, a full queue, an idempotent replay) leaves nothing behind. Everything here is
shared by `POST /v1/jobs` and `POST /v1/jobs/batch`.

Creating jobs is one Redis round trip whatever their number: a pipeline of atomic scripts,
each storing one record and pushing its Celery message together (`api.messages`,
`storage.lua.CREATE`), so no job exists without its message and no message without its record.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from api.celery_client import TaskQueue
from api.errors import ApiError, from_params_error, from_validation_error, invalid
from api.fleet import Fleet
from api.image_fields import check_images, record_params, resolve_images, sent_upload_ids
from api.remote_images import ImageURL
from api.schemas import DEFAULT_WEBHOOK_EVENTS, MAX_DEADLINE_SECONDS, WEBHOOK_EVENTS, JobRequest
from api.settings import ApiSettings
from core.errors import InvalidParamsError
from core.params import LORA_NAME_PATTERN, PRIORITIES, GenerationParams, complete_by_from
from storage.errors import IdempotencyConflictError, StorageError
from storage.job_store import Created, JobStore, NewJobSpec, QueueFullError
from storage.lora_store import LoraStore
from storage.queue_names import DEFAULT_PRIORITY
from storage.upload_store import UploadStore
from storage.url_policy import WebhookCheck, check_webhook_urls

log = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY_CHARS = 255


@dataclass(frozen=True)
class ValidJob:
    params: GenerationParams  # input images resolved to data URIs
    upload_ids: dict[str, str]  # image field -> the upload id it was sent as (the record keeps it as is)
    deadline: float | None
    webhook_url: str | None
    webhook_events: list[str]
    request_hash: str  # identifies the body for Idempotency-Key replays
    priority: str
    preview_every: int | None
    complete_by: float | None = None  # unix seconds it should finish by


def request_hash(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_lora(params: GenerationParams, tenant: str, lora_store: LoraStore | None, field_prefix: str = "") -> None:
    """Refuse a job naming an adapter the tenant cannot use (missing, or another tenant's: the same answer)."""
    if params.lora is None:
        return
    field = f"{field_prefix}lora"
    if not LORA_NAME_PATTERN.fullmatch(params.lora):
        raise invalid(field, f"{field} must be an adapter name: letters, digits, '_', '.', '-' (got {params.lora!r})")
    if lora_store is None:
        raise invalid(field, f"{field}: this service has no LoRA store (STEPWISE_LORA_URL is unset)")
    if lora_store.resolve(tenant, params.lora) is None:
        raise invalid(field, f"{field}: LoRA adapter {params.lora!r} does not exist")


def validate_job(
    data: Any,
    settings: ApiSettings,
    fleet: Fleet | None,
    tenant: str,
    *,
    uploads: UploadStore | None = None,
    field_prefix: str = "",
    default_priority: str | None = None,
    fetched_images: Mapping[ImageURL, str | ApiError] | None = None,
    checked_webhooks: Mapping[str, WebhookCheck] | None = None,
) -> ValidJob:
    """Raise a 422 ApiError naming the first bad field, or return the job ready to store; writes nothing.
    Without an upload store, upload ids name nothing; without a fleet, the served models are not checked.
    Image URLs are fetched and the webhook URL checked here unless
    `fetched_images` and `checked_webhooks` hold them (a batch does its items' together first)."""
    prefix_loc = tuple(_loc(field_prefix))
    try:
        job = JobRequest.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e, prefix_loc) from e
    sent = job.params_dict()
    try:
        params = GenerationParams.from_dict(
            {
                "model": settings.default_model,
                **resolve_images(
                    sent,
                    tenant,
                    uploads,
                    field_prefix,
                    image_hosts=settings.image_url_hosts,
                    fetch_seconds=settings.image_url_timeout_seconds,
                    fetched=fetched_images,
                ),
            }
        )
    except InvalidParamsError as e:
        raise from_params_error(e, field_prefix) from e
    if fleet is not None:
        fleet.check_job(params, field_prefix)
    settings.limits.check(params, field_prefix)
    check_images(params, field_prefix)
    priority = job.priority or default_priority or DEFAULT_PRIORITY
    allowed = settings.max_priority(tenant)
    if PRIORITIES.index(priority) < PRIORITIES.index(allowed):
        raise invalid(f"{field_prefix}priority", f"{field_prefix}priority: this API key may use at most {allowed!r}")

    deadline = None
    if job.deadline is not None:
        deadline = job.deadline.timestamp()
        now = time.time()
        if deadline <= now:
            raise invalid(f"{field_prefix}deadline", f"{field_prefix}deadline must be in the future")
        if deadline > now + MAX_DEADLINE_SECONDS:
            raise invalid(
                f"{field_prefix}deadline",
                f"{field_prefix}deadline must be at most {MAX_DEADLINE_SECONDS // 86400} days from now",
            )

    try:
        complete_by = complete_by_from(
            job.complete_by.timestamp() if job.complete_by is not None else None, job.slo_seconds, time.time()
        )
    except InvalidParamsError as e:
        raise from_params_error(e, field_prefix) from e

    events = list(DEFAULT_WEBHOOK_EVENTS)
    if job.webhook_events is not None:
        if job.webhook_url is None:
            raise invalid(f"{field_prefix}webhook_events", f"{field_prefix}webhook_events needs webhook_url")
        events = [event for event in WEBHOOK_EVENTS if event in job.webhook_events]
    if job.webhook_url is not None:
        check_webhook(job.webhook_url, settings, f"{field_prefix}webhook_url", checked_webhooks)
    return ValidJob(
        params=params,
        upload_ids=sent_upload_ids(sent),
        deadline=deadline,
        webhook_url=job.webhook_url,
        webhook_events=events if job.webhook_url else [],
        request_hash=request_hash(data),
        priority=priority,
        preview_every=job.preview_every,
        complete_by=complete_by,
    )


def webhook_url_of(item: Any) -> str | None:
    """The webhook URL of a job as sent, if it holds one (the item's own validation judges anything else)."""
    url = item.get("webhook_url") if isinstance(item, dict) else None
    return url if isinstance(url, str) else None


def check_webhooks(urls: list[str], settings: ApiSettings) -> dict[str, WebhookCheck]:
    """The webhook URL policy's check of each URL: each distinct host looked up once, 8 at a time, all by
    one deadline STEPWISE_WEBHOOK_LOOKUP_TIMEOUT_SECONDS from now."""
    deadline = time.monotonic() + settings.webhook_lookup_timeout_seconds
    return check_webhook_urls(urls, settings.webhook_allow, deadline=deadline)


def check_webhook(url: str, settings: ApiSettings, field: str, checked: Mapping[str, WebhookCheck] | None) -> None:
    """Raise a 422 ApiError naming `field` unless the policy allows `url` (checked now unless in `checked`)."""
    outcome = checked[url] if checked is not None and url in checked else check_webhooks([url], settings)[url]
    if isinstance(outcome, TimeoutError):
        raise invalid(
            field,
            f"{field}: its host did not resolve within {settings.webhook_lookup_timeout_seconds:g}s"
            " (STEPWISE_WEBHOOK_LOOKUP_TIMEOUT_SECONDS)",
        ) from outcome
    if outcome is not None:
        raise invalid(field, f"{field} {outcome}") from outcome


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
        raise invalid(
            "Idempotency-Key",
            f"the Idempotency-Key header must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} printable ASCII characters",
        )
    return raw


def batch_item_key(idempotency_key: str | None, index: int) -> str | None:
    """A batch item's own key. The separator is a control character, which an Idempotency-Key
    header cannot hold, so no single submit can replay a batch item (`bk#1` stays `bk#1`)."""
    return f"{idempotency_key}\x1fbatch\x1f{index}" if idempotency_key else None


@dataclass
class QueueRoom:
    """What one request may still queue: the global STEPWISE_MAX_QUEUE_DEPTH and the tenant's
    quotas, read once per request and counted down per accepted job, so a batch takes what fits
    and gets 429 for the rest. Concurrent requests may overshoot a cap by a few jobs."""

    store: JobStore
    settings: ApiSettings
    tenant: str
    num_queued: int = 0
    num_tenant_queued: int = 0
    num_taken: int = 0  # jobs this request queued so far

    @classmethod
    def read(cls, store: JobStore, settings: ApiSettings, tenant: str, *, global_depth: bool = True) -> QueueRoom:
        """`global_depth=False` leaves the global limit to the CREATE script, which checks it
        atomically anyway (one Redis round trip fewer for a single submit)."""
        tenant_queued = store.tenant_queue_depth(tenant) if settings.tenant_max_queued else 0
        return cls(store, settings, tenant, store.queue_depth() if global_depth else 0, tenant_queued)

    def take_one(self) -> None:
        """Claim room for one more job, or raise a 429 ApiError saying which limit is reached."""
        self.check_depths()
        settings = self.settings
        if settings.tenant_jobs_per_minute:
            wait = self.store.reserve_submit_slot(self.tenant, settings.tenant_jobs_per_minute)
            if wait is not None:
                raise self.full(
                    "rate_limited",
                    f"this API key's tenant submitted {settings.tenant_jobs_per_minute}"
                    " jobs this minute (STEPWISE_TENANT_JOBS_PER_MINUTE)",
                    retry_after=max(1, int(wait + 0.999)),
                )
        self.num_taken += 1

    def check_depths(self) -> None:
        """Raise a 429 ApiError unless the queue and the tenant's queued jobs have room for one more."""
        settings = self.settings
        depth = self.num_queued + self.num_taken
        if depth >= settings.max_queue_depth:
            raise self.full("queue_full", f"{depth} jobs are queued, at the limit of {settings.max_queue_depth}")
        tenant_depth = self.num_tenant_queued + self.num_taken
        if settings.tenant_max_queued and tenant_depth >= settings.tenant_max_queued:
            raise self.full(
                "tenant_queue_full",
                f"this API key's tenant has {tenant_depth} jobs queued, at its "
                f"limit of {settings.tenant_max_queued} (STEPWISE_TENANT_MAX_QUEUED)",
            )

    def full(self, code: str, why: str, *, retry_after: int | None = None) -> ApiError:
        seconds = retry_after if retry_after is not None else self.settings.retry_after_seconds
        return ApiError(429, code, f"{why}; retry later", headers={"Retry-After": str(seconds)})


def queue_full(settings: ApiSettings, num_queued: int) -> ApiError:
    return ApiError(
        429,
        "queue_full",
        f"{num_queued} jobs are queued, at the limit of {settings.max_queue_depth}; retry later",
        headers={"Retry-After": str(settings.retry_after_seconds)},
    )


def create_jobs(
    store: JobStore,
    queue: TaskQueue,
    settings: ApiSettings,
    tenant: str,
    jobs: list[tuple[ValidJob, str | None]],
    uploads: UploadStore | None,
) -> list[Created | ApiError]:
    """Store the jobs with their messages, and with each its inline input images (as uploads, in the same script:
    records hold upload ids, and a refused job stores none). One outcome per (job, idempotency key): Created (an
    idempotent replay is not sent again) or the item's ApiError (409, 429)."""
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
    outcomes = store.create_many(
        specs, max_queued=settings.max_queue_depth, message_for=queue.generate_messages.for_record
    )
    return [_api_outcome(outcome, settings) for outcome in outcomes]


def _api_outcome(outcome: Created | StorageError, settings: ApiSettings) -> Created | ApiError:
    if isinstance(outcome, Created):
        return outcome
    if isinstance(outcome, IdempotencyConflictError):
        return ApiError(409, "idempotency_conflict", "this Idempotency-Key was used with a different request body")
    if isinstance(outcome, QueueFullError):
        return queue_full(settings, outcome.num_queued)
    raise outcome
