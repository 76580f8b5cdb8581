"""The /v1/jobs blueprint: submit, batch, poll, list, cancel, image. Every route needs an API key."""

from __future__ import annotations

import dataclasses
import logging
import uuid

from flask import Blueprint, Response, g, redirect, request
from pydantic import ValidationError
from werkzeug.routing import BaseConverter

from api.auth import require_tenant
from api.errors import ApiError, from_validation_error, invalid, not_found
from api.image_fields import remote_image_urls
from api.job_view import job_url, job_view
from api.remote_images import fetch_images
from api.request_body import read_json
from api.resources import (
    get_fleet,
    get_image_store,
    get_job_store,
    get_lora_store,
    get_settings,
    get_task_queue,
    get_upload_store,
)
from api.schemas import BatchRequest, ImageQuery, ListQuery
from api.submission import (
    QueueRoom,
    batch_item_key,
    check_idempotency_key,
    check_lora,
    check_webhooks,
    create_jobs,
    validate_job,
    webhook_url_of,
)
from api.waiting import event_stream, json_rendered, prefer_wait, waited
from storage.errors import (
    ImageNotFoundError,
    InvalidCursorError,
    InvalidTransitionError,
    StorageError,
)
from storage.image_store import content_type_of_key
from storage.job_store import JobRecord, JobState
from storage.webhooks import build_payload

log = logging.getLogger(__name__)

bp = Blueprint("jobs", __name__, url_prefix="/v1/jobs")
bp.before_request(require_tenant)

MAX_JOB_ID_CHARS = 128
DELETED_TOMBSTONE_SECONDS = 24 * 3600  # how long a worker still running a deleted job can learn it was deleted


class JobIdConverter(BaseConverter):
    """A job id in a path: anything but `batch`, so GET /v1/jobs/batch is 405 (only POST), not "job not found"."""

    regex = r"(?!batch$)[^/]+"


def own_job(job_id: str) -> JobRecord:
    """The caller's job, or 404 (also for another tenant's job: its existence is not revealed)."""
    store = get_job_store()
    record = store.get(job_id) if len(job_id) <= MAX_JOB_ID_CHARS else None
    if record is None or record.tenant != g.tenant:
        raise not_found()
    return record


def view_with_position(record: JobRecord) -> dict:
    return views_with_positions([record])[0]


def views_with_positions(records: list[JobRecord]) -> list[dict]:
    """Job views; queued ones with their queue position and ETA inputs (one Redis round trip)."""
    store = get_job_store()
    queued = [record for record in records if record.state is JobState.QUEUED]
    positions = dict(zip((record.job_id for record in queued), store.queue_positions(queued))) if queued else {}
    return [queued_view(record, positions.get(record.job_id)) for record in records]


def queued_view(record: JobRecord, position: int | None) -> dict:
    return job_view(record, position, get_fleet().queue_info(record, position))


@bp.post("")
def submit():
    settings, store, queue = get_settings(), get_job_store(), get_task_queue()
    idempotency_key = check_idempotency_key(request.headers.get("Idempotency-Key"))
    wait_seconds = prefer_wait(request.headers.getlist("Prefer"))
    job = validate_job(read_json(), settings, get_fleet(), g.tenant, uploads=get_upload_store())
    check_lora(job.params, g.tenant, get_lora_store())
    QueueRoom.read(store, settings, g.tenant, global_depth=False).take_one()
    outcome = create_jobs(store, queue, settings, g.tenant, [(job, idempotency_key)], get_upload_store())[0]
    if isinstance(outcome, ApiError):
        raise outcome
    record = outcome.record
    headers = {"Location": job_url(record.job_id)}
    if not outcome.created:
        headers["Idempotent-Replayed"] = "true"
    if wait_seconds is not None:
        return waited(record.job_id, wait_seconds, lambda has_ended: waited_answer(record, headers, wait_seconds))
    if not outcome.created:
        return view_with_position(record), 202, headers
    return queued_view(record, outcome.queue_position), 202, headers


def waited_answer(record: JobRecord, headers: dict[str, str], wait_seconds: int):
    """After a `Prefer: wait`: 200 with the ended job, or 202 with it as it is now (and Location)."""
    current = get_job_store().get(record.job_id) or record
    applied = {**headers, "Preference-Applied": f"wait={wait_seconds}"}
    if current.state.is_terminal:
        applied.pop("Location")
        return json_rendered(200, view_with_position(current), list(applied.items()))
    return json_rendered(202, view_with_position(current), list(applied.items()))


@bp.post("/batch")
def submit_batch():
    settings, store, queue = get_settings(), get_job_store(), get_task_queue()
    idempotency_key = check_idempotency_key(request.headers.get("Idempotency-Key"))
    try:
        batch = BatchRequest.model_validate(read_json())
    except ValidationError as e:
        raise from_validation_error(e) from e
    items = batch.jobs
    if len(items) > settings.max_batch_jobs:
        raise invalid("jobs", f"jobs: at most {settings.max_batch_jobs} jobs per batch (got {len(items)})")
    room = QueueRoom.read(store, settings, g.tenant)
    room.check_depths()  # nothing fits: the whole batch gets 429, as POST /v1/jobs would
    # all items' image URLs at once, by one deadline: a batch of slow URLs costs one deadline, not one each
    fetched = fetch_images(
        [url for index, item in enumerate(items) for url in remote_image_urls(item, f"jobs[{index}].")],
        settings.image_url_hosts,
        seconds=settings.image_url_timeout_seconds,
    )
    # likewise their webhook URLs: each distinct host looked up once, 8 at a time, by one deadline of its own
    checked_webhooks = check_webhooks([url for item in items if (url := webhook_url_of(item)) is not None], settings)
    results: list[dict | None] = [None] * len(items)
    valid = []  # (index, job, item idempotency key)
    for index, item in enumerate(items):
        try:
            job = validate_job(
                item,
                settings,
                get_fleet(),
                g.tenant,
                uploads=get_upload_store(),
                field_prefix=f"jobs[{index}].",
                default_priority=batch.priority,
                fetched_images=fetched,
                checked_webhooks=checked_webhooks,
            )
            check_lora(job.params, g.tenant, get_lora_store(), f"jobs[{index}].")
            room.take_one()
        except ApiError as e:
            if e.status >= 500:
                raise
            results[index] = {"index": index, "status": e.status, "error": e.body()["error"]}
            continue
        valid.append((index, job, batch_item_key(idempotency_key, index)))
    jobs = [(job, key) for _, job, key in valid]
    outcomes = create_jobs(store, queue, settings, g.tenant, jobs, get_upload_store()) if valid else []
    replayed = [outcome.record for outcome in outcomes if not isinstance(outcome, ApiError) and not outcome.created]
    replayed_views = dict(zip((record.job_id for record in replayed), views_with_positions(replayed)))
    for (index, _, _), outcome in zip(valid, outcomes):
        if isinstance(outcome, ApiError):
            results[index] = {"index": index, "status": outcome.status, "error": outcome.body()["error"]}
        elif outcome.created:
            results[index] = {"index": index, "status": 202, "job": queued_view(outcome.record, outcome.queue_position)}
        else:
            results[index] = {"index": index, "status": 202, "job": replayed_views[outcome.record.job_id]}
    num_accepted = sum(1 for result in results if result["status"] == 202)
    return {"results": results, "num_accepted": num_accepted}, 200


@bp.get("")
def list_jobs():
    store = get_job_store()
    try:
        query = ListQuery.model_validate(request.args.to_dict())
    except ValidationError as e:
        raise from_validation_error(e) from e
    state = JobState(query.state) if query.state else None
    try:
        records, next_cursor = store.list_for_tenant(g.tenant, state=state, limit=query.limit, cursor=query.cursor)
    except InvalidCursorError as e:
        raise invalid("cursor", "cursor is not one this API handed out") from e
    return {"jobs": views_with_positions(records), "next_cursor": next_cursor}


@bp.get("/<jobid:job_id>")
def get_job(job_id: str):
    return view_with_position(own_job(job_id))


@bp.get("/<jobid:job_id>/events")
def job_events(job_id: str):
    return event_stream(own_job(job_id), view_with_position)


@bp.delete("/<jobid:job_id>")
def delete_job(job_id: str):
    """Remove the caller's job record and its images; a queued job is canceled first, a running one stops at
    its next step (its worker finds the record gone and removes what it stored meanwhile)."""
    record = own_job(job_id)
    state = get_job_store().delete(job_id, DELETED_TOMBSTONE_SECONDS)
    if state is None:
        raise not_found()
    if state is JobState.QUEUED:
        send_canceled_webhook(dataclasses.replace(record, state=JobState.CANCELED))
    try:
        get_image_store().delete_job_images(job_id)
    except StorageError as e:  # the record is gone; the images go at their retention (STEPWISE_IMAGE_TTL)
        log.warning("job %s deleted, but not its images: %s", job_id, e)
    return Response(status=204)


ALREADY_ENDED = {  # what a cancel of a finished job says: "the job already succeeded"
    JobState.SUCCEEDED: "already succeeded",
    JobState.FAILED: "already failed",
    JobState.CANCELED: "was already canceled",
    JobState.EXPIRED: "already expired",
}


@bp.post("/<job_id>/cancel")
def cancel_job(job_id: str):
    store = get_job_store()
    record = own_job(job_id)
    try:
        new_state = store.request_cancel(job_id)
    except InvalidTransitionError as e:
        current = store.get(job_id) or record
        raise ApiError(409, "job_finished", f"the job {ALREADY_ENDED[current.state]}; nothing to cancel") from e
    record = store.get(job_id) or record
    if new_state is JobState.CANCELED:
        send_canceled_webhook(record)
        return view_with_position(record), 200
    return view_with_position(record), 202


def send_canceled_webhook(record: JobRecord) -> None:
    """A queued job canceled here never reaches a worker, so the API sends its `canceled` event."""
    if not record.webhook_url or "canceled" not in record.webhook_events:
        return
    queue = get_task_queue()
    try:
        payload = build_payload(record, "canceled", status_url=job_url(record.job_id))
        queue.enqueue_webhook(record.job_id, "canceled", f"msg_{uuid.uuid4().hex}", payload)
    except Exception as e:  # the cancel happened; a lost notification must not turn it into an error
        log.warning("could not enqueue the canceled webhook of job %s: %s", record.job_id, e)


@bp.get("/<job_id>/image")
def get_image(job_id: str):
    record = own_job(job_id)
    try:
        index = ImageQuery.model_validate(request.args.to_dict()).index
    except ValidationError as e:
        raise from_validation_error(e) from e
    if record.state is not JobState.SUCCEEDED:
        raise ApiError(409, "no_image", f"the job is {record.state.value}; its image exists once it has succeeded")
    if index >= len(record.image_keys):
        raise not_found("image")
    images = get_image_store()
    key = record.image_keys[index]
    presigned = images.presigned_url(key)
    if presigned:
        return redirect(presigned, 302)
    try:
        data = images.get_bytes(key)
    except ImageNotFoundError as e:
        raise not_found("image") from e
    return Response(data, mimetype=content_type_of_key(key), headers={"Cache-Control": "private, max-age=3600"})
