"""The OpenAI-style video routes the open engines serve (vllm-omni, SGLang, FastVideo): `POST /v1/videos`,
`GET /v1/videos`, `GET /v1/videos/{video_id}`, `GET /v1/videos/{video_id}/content`, `DELETE /v1/videos/{video_id}`.

A video is a job whose output is a video (a video model's job, `output_format` mp4, webm or gif): its id is the job's
id, so `GET /v1/jobs/{job_id}` and its event stream show it too. A create request becomes one job through the same
path as `POST /v1/jobs` (api.submission: keys, tenants, validation, limits, quotas, priorities) and is answered at
once with the queued video; its MP4 is at `/content` once `completed`. Fields: OpenAI's (`prompt`, `model`, `size`
WxH, `seconds`, `input_reference`: the first frame of an image-to-video model) and stepwise's (`num_frames`, `fps`,
`seed`, ...). JSON or multipart (what the `openai` SDK sends). Errors have OpenAI's shape, `param` naming the field.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, g, request
from pydantic import ValidationError

from api.auth import require_tenant
from api.errors import ApiError, from_validation_error, invalid, not_found
from api.job_validation import check_idempotency_key
from api.jobs import IDEMPOTENCY_KEY, MAX_JOB_ID_CHARS, JobIdConverter, delete_own_job, output_response
from api.openai_fields import SIZE, check_model_kind, data_uri
from api.openai_images import OPENAI_ERRORS, openai_error_answer
from api.openai_schemas import (
    VIDEO_EXTENSIONS,
    OpenAIError,
    OpenAIVideo,
    OpenAIVideoCreate,
    OpenAIVideoCreateForm,
    OpenAIVideoDeleted,
    OpenAIVideoFields,
    OpenAIVideoList,
    VideoContentQuery,
    VideoListQuery,
)
from api.openapi_operations import BINARY, Answer, documented, parameter, query_of
from api.request_body import is_json_type, read_form, read_json
from api.resources import get_fleet, get_job_store, get_settings
from api.submission import submit_job
from core.families import FAMILIES
from core.image_inputs import MAX_IMAGE_BYTES
from core.output_formats import DEFAULT_VIDEO_FORMAT, VIDEO_FORMATS
from storage.errors import InvalidCursorError
from storage.job_record import JobRecord, JobState
from storage.tenant_listing import encode_cursor

bp = Blueprint("openai_videos", __name__, url_prefix="/v1/videos")
bp.before_request(require_tenant)

VIDEO_ID = parameter(
    "video_id", "path", "The video's id (its job's).", MAX_JOB_ID_CHARS, pattern=f"^{JobIdConverter.regex}$"
)

PARAM_OF_FIELD = {"height": "size", "width": "size", "init_image": "input_reference", "resize_mode": "size"}
STATUS_OF_STATE = {
    JobState.QUEUED: "queued",
    JobState.RUNNING: "in_progress",
    JobState.SUCCEEDED: "completed",
    JobState.FAILED: "failed",
    JobState.CANCELED: "failed",
    JobState.EXPIRED: "failed",
}
MULTIPART_OVERHEAD_BYTES = 64 * 1024
VIDEO_ERRORS = {
    **OPENAI_ERRORS,
    400: "Invalid request (OpenAI's shape; `param` names the field); an image model: code model_not_video "
    "(POST /v1/images/generations draws images).",
    404: "No such video for this key, or no worker serves the model (model_not_found).",
    409: "This Idempotency-Key was used with a different request body (idempotency_conflict).",
    503: "Redis, storage or the queue is unavailable.",
}
del VIDEO_ERRORS[500], VIDEO_ERRORS[504]  # nothing waits here


@bp.errorhandler(Exception)
def openai_error(error: Exception):
    param_of_field = PARAM_OF_FIELD
    if isinstance(error, ApiError) and error.field == "num_frames" and getattr(g, "sent_seconds", False):
        param_of_field = {**PARAM_OF_FIELD, "num_frames": "seconds"}
    return openai_error_answer(error, param_of_field)


@bp.post("")
@documented(
    "OpenAI's create video: one job, answered at once with the queued video.",
    body=OpenAIVideoCreate,
    form=OpenAIVideoCreateForm,
    parameters=(IDEMPOTENCY_KEY,),
    responses={200: Answer("The video, queued (or the original one, for a replayed Idempotency-Key).", OpenAIVideo)},
    errors=VIDEO_ERRORS,
    error_model=OpenAIError,
)
def create_video():
    idempotency_key = check_idempotency_key(request.headers.get("Idempotency-Key"))
    return video_object(submit_job(translate_video_request(), idempotency_key).record)


def translate_video_request() -> dict[str, Any]:
    """The request (JSON, or a multipart form with an input_reference file) as a POST /v1/jobs body."""
    if is_json_type(request.mimetype):
        fields, image = read_json(), None
        if not isinstance(fields, dict):
            raise invalid(None, "the request body must be a JSON object")
    elif request.mimetype == "multipart/form-data":
        request.max_content_length = MAX_IMAGE_BYTES + MULTIPART_OVERHEAD_BYTES
        form, files = read_form()
        fields = dict(form.items())
        part = files.get("input_reference")
        image = data_uri("input_reference", part) if part is not None else None
    else:
        raise ApiError(415, "unsupported_media_type", "send the video request as JSON or multipart/form-data")
    for name in fields:
        if name not in OpenAIVideoFields.model_fields:
            raise invalid(name, f"Unrecognized request argument supplied: {name}")
    try:
        video = OpenAIVideoFields.model_validate(fields, strict=is_json_type(request.mimetype))  # a form: all text
    except ValidationError as e:
        raise from_validation_error(e) from e
    job: dict[str, Any] = {"prompt": video.prompt, "output_format": DEFAULT_VIDEO_FORMAT}
    if video.model is not None:
        job["model"] = video.model
    model = job.get("model", get_settings().default_model)
    family = get_fleet().family_for(model)
    check_model_kind(model, family, wants_video=True)
    match = SIZE.fullmatch(video.size or "")
    if match is not None:
        job["width"], job["height"] = int(match.group(1)), int(match.group(2))
    for name in VIDEO_EXTENSIONS:
        value = getattr(video, name)
        if value is not None:
            job[name] = value
    if video.seconds is not None:
        job["num_frames"] = frames_for(float(video.seconds), video, family)
        g.sent_seconds = True
    reference = image if image is not None else reference_of(video.input_reference)
    if reference is not None:
        job["init_image"] = reference
        if "width" in job:
            job["resize_mode"] = "crop"  # an image of another size covers the size, then is cropped
    return job


def frames_for(seconds: float, video: OpenAIVideoFields, family: str | None) -> int:
    """num_frames for a duration: seconds x fps frames after the first, rounded to the family's rule (4k+1)."""
    if video.num_frames is not None:
        raise invalid("seconds", "seconds: give seconds or num_frames, not both")
    if family is None:
        raise invalid("seconds", "seconds: the model's family is not known yet (no worker served it): give num_frames")
    spec = FAMILIES[family]
    fps = video.fps if video.fps is not None else spec.default_fps or 1
    step = spec.frames_per_latent
    num_frames = max(1, round(seconds * fps / step)) * step + 1
    if num_frames > spec.max_num_frames:
        longest = (spec.max_num_frames - 1) / fps
        raise invalid("seconds", f"seconds: at most {longest:g} at {fps} fps ({spec.max_num_frames} frames)")
    return num_frames


def reference_of(value: str | dict[str, str] | None) -> str | None:
    """input_reference in JSON: the image reference itself, or OpenAI's {"image_url": ...} / {"file_id": ...}."""
    if value is None or isinstance(value, str):
        return value
    if len(value) != 1 or not set(value) <= {"image_url", "file_id"}:
        raise invalid("input_reference", 'input_reference must be {"image_url": ...} or {"file_id": ...}')
    return next(iter(value.values()))


@bp.get("")
@documented(
    "The caller's videos, newest first.",
    query=VideoListQuery,
    responses={200: Answer("A page of videos.", OpenAIVideoList)},
    errors={status: VIDEO_ERRORS[status] for status in (400, 404, 503)},
    error_model=OpenAIError,
)
def list_videos():
    query = query_of(VideoListQuery)
    cursor = None
    if query.after is not None:
        after = own_video(query.after, field="after")
        cursor = encode_cursor(after.created_at, after.job_id)
    try:
        records, _ = get_job_store().list_for_tenant(g.tenant, limit=query.limit + 1, cursor=cursor, keep=is_video)
    except InvalidCursorError as e:
        raise invalid("after", "after is not a video of this key") from e
    page = [video_object(record) for record in records[: query.limit]]
    return {
        "object": "list",
        "data": page,
        "has_more": len(records) > query.limit,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


@bp.get("/<jobid:video_id>")
@documented(
    "A video's status and progress.",
    responses={200: Answer("The video.", OpenAIVideo)},
    errors={status: VIDEO_ERRORS[status] for status in (404, 503)},
    error_model=OpenAIError,
)
def get_video(video_id: str):
    return video_object(own_video(video_id))


@bp.get("/<jobid:video_id>/content")
@documented(
    "The video's file (MP4, or the job's output_format) once completed (local storage), or a redirect to it (S3).",
    query=VideoContentQuery,
    responses={
        200: Answer("The video.", content=dict.fromkeys(dict.fromkeys(VIDEO_FORMATS.values()), BINARY)),
        302: Answer("Redirect to a presigned URL.", headers={"Location": {"schema": {"type": "string"}}}),
    },
    errors={
        **{status: VIDEO_ERRORS[status] for status in (400, 404, 503)},
        409: "The video is not completed (yet).",
    },
    error_model=OpenAIError,
)
def get_video_content(video_id: str):
    query_of(VideoContentQuery)
    record = own_video(video_id)
    if record.state is not JobState.SUCCEEDED:
        status = STATUS_OF_STATE[record.state]
        raise ApiError(409, "video_not_ready", f"the video is {status}; its file exists once it has completed")
    return output_response(record, 0)


@bp.delete("/<jobid:video_id>")
@documented(
    "Delete the video: its job and file (a queued or running one is canceled first).",
    responses={200: Answer("Deleted.", OpenAIVideoDeleted)},
    errors={status: VIDEO_ERRORS[status] for status in (404, 503)},
    error_model=OpenAIError,
)
def delete_video(video_id: str):
    delete_own_job(own_video(video_id))
    return {"id": video_id, "object": "video.deleted", "deleted": True}


def is_video(record: JobRecord) -> bool:
    return record.params.get("output_format") in VIDEO_FORMATS


def own_video(video_id: str, field: str | None = None) -> JobRecord:
    """The caller's video, or 404 (also for another tenant's, or a job that is an image)."""
    record = get_job_store().get(video_id) if len(video_id) <= MAX_JOB_ID_CHARS else None
    if record is None or record.tenant != g.tenant or not is_video(record):
        error = not_found("video")
        error.field = field
        raise error
    return record


def video_object(record: JobRecord) -> dict[str, Any]:
    params = record.params
    num_frames, fps = int(params.get("num_frames") or 1), int(params.get("fps") or 1)
    progress = record.progress_view()
    percent = 100 if record.state is JobState.SUCCEEDED else 100 * progress["step"] // max(1, progress["total"])
    status = STATUS_OF_STATE[record.state]
    error = None
    if status == "failed":
        error = {"code": record.error_code or record.state.value, "message": record.error_message or ""}
    return {
        "id": record.job_id,
        "object": "video",
        "status": status,
        "progress": min(percent, 100),
        "created_at": int(record.created_at),
        "completed_at": int(record.finished_at) if record.finished_at is not None else None,
        "error": error,
        "model": params.get("model", ""),
        "prompt": params.get("prompt", ""),
        "size": f"{params.get('width')}x{params.get('height')}",
        "seconds": f"{(num_frames - 1) / fps:g}",
        "num_frames": num_frames,
        "fps": fps,
        "seed": int(params.get("seed") or 0),
    }
