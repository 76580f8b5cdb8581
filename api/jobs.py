"""The /v1/jobs blueprint: submit, batch, poll, list, cancel, image. Every route needs an API key."""

from __future__ import annotations

import dataclasses
import logging
import uuid

from flask import Blueprint, Response, g, redirect, request
from werkzeug.routing import BaseConverter
from werkzeug.wrappers import Response as BaseResponse

from api import submission
from api.answers import BatchResponse, JobList, JobView
from api.auth import require_tenant
from api.errors import ApiError, invalid, not_found
from api.event_stream import EVENT
from api.job_validation import MAX_IDEMPOTENCY_KEY_CHARS, batch_item_key, check_idempotency_key
from api.job_view import job_url, job_view
from api.openapi_operations import (
    BINARY,
    OUTPUT_TYPES,
    Answer,
    api_errors,
    body_of,
    documented,
    parameter,
    query_of,
)
from api.request_body import read_json
from api.resources import get_fleet, get_image_store, get_job_store, get_settings, get_task_queue
from api.schemas import BatchRequest, ImageQuery, JobRequest, ListQuery
from api.submission import JobSubmit, Submitted
from api.waiting import (
    LAST_EVENT_ID,
    PREFER,
    PREFERENCE_APPLIED,
    event_stream,
    json_rendered,
    prefer_wait,
    waited,
)
from storage.errors import (
    ImageNotFoundError,
    InvalidCursorError,
    InvalidTransitionError,
    JobStoringError,
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


JOB_ID = parameter("job_id", "path", "The job's id.", MAX_JOB_ID_CHARS, pattern=f"^{JobIdConverter.regex}$")
IDEMPOTENCY_KEY = parameter(
    "Idempotency-Key",
    "header",
    "Retries with the same key and body return the original job; the same key with another body gets 409.",
    MAX_IDEMPOTENCY_KEY_CHARS,
    pattern=r"^[ -~]*[!-~][ -~]*$",  # printable ASCII, not only spaces (api.job_validation.check_idempotency_key)
    required=False,
)
LOCATION = {"Location": {"description": "The job's URL.", "schema": {"type": "string"}}}


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
@documented(
    "Submit a generation job.",
    body=JobRequest,
    parameters=(IDEMPOTENCY_KEY, PREFER),
    responses={
        202: Answer(
            "Queued (or the original job, for a replayed Idempotency-Key); with Prefer: wait, not ended within it.",
            JobView,
            headers={**LOCATION, **PREFERENCE_APPLIED},
        ),
        200: Answer("With Prefer: wait, the job ended within the wait.", JobView, headers=PREFERENCE_APPLIED),
    },
    errors={
        **api_errors(400, 409, 413, 415, 422, 429, 503),
        404: "With Prefer: wait, the job was deleted during the wait.",
    },
)
def submit_job():
    idempotency_key = check_idempotency_key(request.headers.get("Idempotency-Key"))
    wait_seconds = prefer_wait(request.headers.getlist("Prefer"))
    submitted = submission.submit_job(read_json(), idempotency_key)
    if wait_seconds is not None:
        return waited(submitted.record.job_id, wait_seconds, lambda end: waited_answer(submitted, wait_seconds))
    return submitted_view(submitted), 202, submitted.headers()


def submitted_view(submitted: Submitted) -> dict:
    """A submitted job's view: a new one with the position its create returned, a replay as it is now."""
    if submitted.created:
        return queued_view(submitted.record, submitted.queue_position)
    return view_with_position(submitted.record)


def waited_answer(submitted: Submitted, wait_seconds: int):
    """After a `Prefer: wait`: 200 with the ended job, or 202 with it as it is now (and Location: the wait ran
    out, or this process is shutting down); 404 if it was deleted meanwhile, as its GET answers then."""
    current = get_job_store().get(submitted.record.job_id)
    if current is None:
        raise not_found()
    applied = {**submitted.headers(), "Preference-Applied": f"wait={wait_seconds}"}
    if current.state.is_terminal:
        applied.pop("Location")
        return json_rendered(200, view_with_position(current), list(applied.items()))
    return json_rendered(202, view_with_position(current), list(applied.items()))


@bp.post("/batch")
@documented(
    "Submit up to STEPWISE_MAX_BATCH_JOBS jobs; each item gets its own result.",
    body=BatchRequest,
    parameters=(IDEMPOTENCY_KEY,),
    responses={200: Answer("One result per item.", BatchResponse)},
    errors=api_errors(400, 413, 415, 422, 429, 503),
)
def submit_batch():
    settings = get_settings()
    idempotency_key = check_idempotency_key(request.headers.get("Idempotency-Key"))
    batch = body_of(BatchRequest)
    items = batch.jobs
    if len(items) > settings.max_batch_jobs:
        raise invalid("jobs", f"jobs: at most {settings.max_batch_jobs} jobs per batch (got {len(items)})")
    outcomes = submission.submit_jobs(
        [
            JobSubmit(item, batch_item_key(idempotency_key, index), field_prefix=f"jobs[{index}].")
            for index, item in enumerate(items)
        ],
        default_priority=batch.priority,
    )
    refused = [outcome for outcome in outcomes if isinstance(outcome, ApiError)]
    if refused and len(refused) == len(outcomes) and all(error.status == 429 for error in refused):
        raise refused[0]  # nothing fits: the whole batch gets 429, as POST /v1/jobs would
    replayed = [outcome.record for outcome in outcomes if isinstance(outcome, Submitted) and not outcome.created]
    replayed_views = dict(zip((record.job_id for record in replayed), views_with_positions(replayed)))
    results = []
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, ApiError):
            results.append({"index": index, "status": outcome.status, "error": outcome.body()["error"]})
        elif outcome.created:
            results.append({"index": index, "status": 202, "job": queued_view(outcome.record, outcome.queue_position)})
        else:
            results.append({"index": index, "status": 202, "job": replayed_views[outcome.record.job_id]})
    return {"results": results, "num_accepted": len(outcomes) - len(refused)}, 200


@bp.get("")
@documented(
    "The caller's jobs, newest first.",
    query=ListQuery,
    responses={200: Answer("A page of jobs.", JobList)},
    errors=api_errors(422, 503),
)
def list_jobs():
    store = get_job_store()
    query = query_of(ListQuery)
    state = JobState(query.state) if query.state else None
    try:
        records, next_cursor = store.list_for_tenant(g.tenant, state=state, limit=query.limit, cursor=query.cursor)
    except InvalidCursorError as e:
        raise invalid("cursor", "cursor is not one this API handed out") from e
    return {"jobs": views_with_positions(records), "next_cursor": next_cursor}


@bp.get("/<jobid:job_id>")
@documented(
    "A job's state, progress, timings and image URL.",
    responses={200: Answer("The job.", JobView)},
    errors=api_errors(404, 503),
)
def get_job(job_id: str):
    return view_with_position(own_job(job_id))


@bp.get("/<jobid:job_id>/events")
@documented(
    "Server-sent events: queued (with its position), started, progress, preview, storing (its images wait for "
    "image storage), then the end state with the job's view (or an error event: the job deleted, the key "
    "revoked); then the stream ends.",
    parameters=(LAST_EVENT_ID,),
    responses={
        200: Answer("text/event-stream (docs/api.md#event-stream).", content={"text/event-stream": {"schema": EVENT}})
    },
    errors=api_errors(404, 422, 503),
)
def job_events(job_id: str):
    return event_stream(own_job(job_id), view_with_position)


@bp.delete("/<jobid:job_id>")
@documented(
    "Remove the job's record and images (a queued or running job is canceled first).",
    responses={204: Answer("Deleted.")},
    errors=api_errors(404, 503),
)
def delete_job(job_id: str):
    """Remove the caller's job record and its images; a queued job is canceled first, a running one stops at
    its next step (its worker finds the record gone and removes what it stored meanwhile)."""
    delete_own_job(own_job(job_id))
    return Response(status=204)


def delete_own_job(record: JobRecord) -> None:
    """Delete the record (404 if it went meanwhile), send a queued job's canceled webhook, remove its outputs."""
    job_id = record.job_id
    state = get_job_store().delete(job_id, DELETED_TOMBSTONE_SECONDS)
    if state is None:
        raise not_found()
    if state is JobState.QUEUED:
        send_canceled_webhook(dataclasses.replace(record, state=JobState.CANCELED))
    try:
        get_image_store().delete_job_images(job_id)
    except StorageError as e:  # the record is gone; the images go at their retention (STEPWISE_IMAGE_TTL)
        log.warning("job %s deleted, but not its images: %s", job_id, e)


ALREADY_ENDED = {  # what a cancel of a finished job says: "the job already succeeded"
    JobState.SUCCEEDED: "already succeeded",
    JobState.FAILED: "already failed",
    JobState.CANCELED: "was already canceled",
    JobState.EXPIRED: "already expired",
}


@bp.post("/<job_id>/cancel")
@documented(
    "Cancel: a queued job at once, a running one at its next step.",
    responses={
        200: Answer("Canceled.", JobView),
        202: Answer("Cancel requested; the running job stops at its next step.", JobView),
    },
    errors={
        **api_errors(404, 503),
        409: "Nothing to cancel: the job ended (job_finished), or its images are made and wait for image storage "
        "(job_storing: it succeeds once they are stored).",
    },
)
def cancel_job(job_id: str):
    store = get_job_store()
    record = own_job(job_id)
    try:
        new_state = store.request_cancel(job_id)
    except JobStoringError as e:
        raise ApiError(
            409,
            "job_storing",
            "the job cannot be canceled: its images are made and wait in its worker's spool for image storage, "
            "and it succeeds once they are stored (DELETE /v1/jobs/{job_id} removes it and its images)",
        ) from e
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
@documented(
    "The job's output in its output_format (local storage) or a redirect to it (S3): an image, or a video job's "
    "video (mp4, webm or gif).",
    query=ImageQuery,
    responses={
        200: Answer("The image or video.", content=dict.fromkeys(OUTPUT_TYPES, BINARY)),
        302: Answer("Redirect to a presigned URL.", headers={"Location": {"schema": {"type": "string"}}}),
    },
    errors=api_errors(404, 409, 422, 503),
)
def get_job_image(job_id: str):
    return output_response(own_job(job_id), query_of(ImageQuery).index)


def output_response(record: JobRecord, index: int) -> BaseResponse:
    """Output `index` of a succeeded job: its bytes with their content type, or a redirect to a presigned URL."""
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
