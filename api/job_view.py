"""JobRecord -> the JSON a client sees (the `JobView` schema)."""

from __future__ import annotations

import time
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

from flask import request

from api.resources import get_fleet, get_image_store, get_settings
from core.builtin_models import prompt_warnings
from core.params import GenerationParams
from storage import public_urls
from storage.job_store import JobRecord, JobState

PARAM_ORDER = {f.name: index for index, f in enumerate(fields(GenerationParams))}


def iso_time(seconds: float | None) -> str | None:
    """RFC 3339 in UTC; None also for a stored time no datetime can hold (a record written before
    deadlines were bounded), so one odd record cannot break a view or a whole listing."""
    if seconds is None:
        return None
    try:
        moment = datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, ValueError, OSError):
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def base_url() -> str:
    return get_settings().public_url or request.host_url.rstrip("/")


def job_url(job_id: str, suffix: str = "") -> str:
    return public_urls.job_url(base_url(), job_id, suffix)


def image_urls(record: JobRecord) -> list[str]:
    if record.state is not JobState.SUCCEEDED:
        return []
    return public_urls.image_urls(base_url(), record.job_id, record.image_keys, get_image_store())


def attempt_view(attempt: dict[str, Any]) -> dict[str, Any]:
    """A recorded delivery attempt, its time in RFC 3339 like every other time in a view."""
    at = attempt.get("at")
    return {**attempt, "at": iso_time(at) if isinstance(at, (int, float)) else at}


def error_view(record: JobRecord) -> dict[str, str] | None:
    if record.error_code or record.error_message:
        return {"code": record.error_code or record.state.value, "message": record.error_message or ""}
    if record.state is JobState.EXPIRED:
        return {"code": "expired", "message": "the job did not start before its deadline"}
    if record.state is JobState.CANCELED:
        return {"code": "canceled", "message": "the job was canceled"}
    return None


def requeued_view(record: JobRecord) -> dict[str, Any] | None:
    """Why the job last went back to the queue (a worker died, drained or shut down), or None."""
    if record.requeued_at is None:
        return None
    message = record.requeue_message or ""
    return {"reason": record.requeue_reason, "message": message, "at": iso_time(record.requeued_at)}


def planned_steps(record: JobRecord, family: str | None = None) -> int:
    """The job's step count before a worker reports it: each image's steps (fewer for an img2img job), by the
    rule the engine uses (`GenerationParams.steps_to_run`) with `family`, the one the workers serve its model
    with (None: the one its model's name says, the fallback family for a folder model no worker served yet)."""
    try:
        return GenerationParams.from_dict(record.params).steps_to_run(family)
    except Exception:  # a record from before a field was added or renamed
        return int(record.params.get("num_inference_steps", 0))


def storing_view(record: JobRecord) -> dict[str, Any] | None:
    """While a running job's images wait in its worker's spool for the image store (worker.spool): since when and
    why; None otherwise."""
    if record.state is not JobState.RUNNING or record.storing_since is None:
        return None
    return {"since": iso_time(record.storing_since), "reason": record.storing_reason or ""}


def is_late(record: JobRecord, now: float | None = None) -> bool:
    """Finished after its complete_by; or, not finished yet, past it or (running) estimated unable to make it."""
    if record.complete_by is None:
        return False
    if record.finished_at is not None:
        return record.finished_at > record.complete_by
    return record.is_late or (time.time() if now is None else now) > record.complete_by


def job_view(
    record: JobRecord, queue_position: int | None = None, queue_info: dict[str, Any] | None = None
) -> dict[str, Any]:
    urls = image_urls(record)
    webhook = None
    if record.webhook_url:
        webhook = {
            "url": record.webhook_url,
            "events": record.webhook_events,
            "attempts": [attempt_view(attempt) for attempt in record.webhook_attempts],
        }
    return {
        "job_id": record.job_id,
        "state": record.state.value,
        "priority": record.priority,
        "preview_every": record.preview_every,
        "queue_position": queue_position if record.state is JobState.QUEUED else None,
        "queue": queue_info if record.state is JobState.QUEUED else None,
        "progress": record.progress_view(
            total=planned_steps(record, get_fleet().family_of(record.params.get("model", "")))
        ),
        "cancel_requested": record.cancel_requested,
        "attempts": record.attempts,
        "requeued": requeued_view(record),
        "created_at": iso_time(record.created_at),
        "started_at": iso_time(record.started_at),
        "finished_at": iso_time(record.finished_at),
        "deadline": iso_time(record.deadline),
        "complete_by": iso_time(record.complete_by),
        "late": is_late(record),
        "paused": record.is_paused and record.state is JobState.RUNNING,
        "storing": storing_view(record),
        "params": dict(sorted(record.params.items(), key=lambda item: PARAM_ORDER.get(item[0], 99))),
        "timings": record.timings,
        "image_url": urls[0] if urls else None,
        "image_urls": urls,
        "error": error_view(record),
        "warnings": prompt_warnings(str(record.params.get("model", "")), str(record.params.get("prompt", ""))),
        "webhook": webhook,
        "status_url": job_url(record.job_id),
        "cancel_url": job_url(record.job_id, "/cancel"),
    }
