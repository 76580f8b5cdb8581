"""Validating one submitted job: the first step of the submit path (api.submission).

Validation runs in three layers: the pydantic model (types and the documented limits,
naming the field), `GenerationParams` (the engine's own rules), and the fleet (a worker
serves the model, and its family supports the fields); then the adapter the job names. It only
reads: an inline or fetched input image is stored as an upload by the script that creates its job,
in the same step, so a job refused anywhere (validation, a 409, a full queue, an idempotent replay)
leaves nothing behind.
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

from api.errors import ApiError, from_params_error, from_validation_error, invalid
from api.fleet import Fleet
from api.image_fields import check_images, resolve_images, sent_upload_ids
from api.remote_images import ImageURL
from api.schemas import DEFAULT_WEBHOOK_EVENTS, MAX_DEADLINE_SECONDS, WEBHOOK_EVENTS, JobRequest
from api.settings import ApiSettings
from core.errors import InvalidParamsError
from core.params import LORA_NAME_PATTERN, PRIORITIES, GenerationParams, complete_by_from
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
