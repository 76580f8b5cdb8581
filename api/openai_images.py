"""The OpenAI images API: `POST /v1/images/generations` (JSON) and `POST /v1/images/edits` (multipart).

What chat front-ends and the official `openai` SDKs speak, over the same API keys, validation,
limits, queue and priorities as `POST /v1/jobs`: a request becomes one job (`n` images are its
`num_images`) through the one submit path (api.submission), then the call waits for the job like
`Prefer: wait` (up to STEPWISE_IMAGES_WAIT_SECONDS, without holding a request thread: api.live)
and answers `{"created", "data": [{"b64_json"} or {"url"}], "output_format", "size"}`, or an error
in OpenAI's shape `{"error": {"message", "type", "param", "code"}}` (docs/api.md#openai-images-api).

Fields (api.openai_schemas, api.openai_fields): OpenAI's are translated (`size` WxH, `n`,
`response_format`, `output_format`, `output_compression`), accepted and ignored (`quality`, `style`,
`user`, ...) or refused when stepwise cannot honour them (`stream`, a transparent `background`); a
few stepwise fields ride along (`seed`, `negative_prompt`, `num_inference_steps`, ...: the SDKs'
`extra_body`); any other name is refused as OpenAI refuses it ("Unrecognized request argument
supplied").
"""

from __future__ import annotations

import base64
import time
from typing import Any

from flask import Blueprint, current_app, request

from api.auth import require_tenant
from api.errors import ApiError, to_api_error
from api.job_view import image_urls, job_url
from api.live import WaitEnd
from api.openai_fields import JobTranslation, check_model_kind, edit_images, translate
from api.openai_schemas import OpenAIError, OpenAIImageEdit, OpenAIImageGeneration, OpenAIImagesResponse
from api.openapi_operations import Answer, documented
from api.request_body import read_form, read_json
from api.resources import get_fleet, get_image_store, get_job_store, get_settings
from api.submission import submit_job
from api.waiting import Rendered, json_rendered, waited
from core.image_inputs import MAX_IMAGE_BYTES
from core.params import MAX_REFERENCE_IMAGES
from storage.job_record import JobRecord, JobState

bp = Blueprint("openai_images", __name__, url_prefix="/v1/images")
bp.before_request(require_tenant)

# A stepwise field named in an error is the OpenAI parameter the client sent.
PARAM_OF_FIELD = {
    "num_images": "n",
    "height": "size",
    "width": "size",
    "resize_mode": "size",
    "output_quality": "output_compression",
    "init_image": "image",
    "reference_images": "image",  # reference_images[i]: image[i], the i-th image sent
    "mask_image": "mask",
}
NO_RETRY = [("x-should-retry", "false")]  # the job exists: an SDK's automatic retry would make another
MULTIPART_OVERHEAD_BYTES = 64 * 1024


def openai_error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        kind = "rate_limit_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@bp.errorhandler(Exception)
def openai_error(error: Exception):
    return openai_error_answer(error, PARAM_OF_FIELD)


def openai_error_answer(error: Exception, param_of_field: dict[str, str]):
    """Any error in OpenAI's shape, `param` the OpenAI parameter the client sent for the stepwise field at fault."""
    api_error = to_api_error(error)
    if api_error.status == 500 and current_app.testing:
        raise error
    status, code = api_error.status, api_error.code
    name, index = (api_error.field or "").partition("[")[::2]
    param = param_of_field[name] + (f"[{index}" if index else "") if name in param_of_field else api_error.field
    if status == 422:  # OpenAI answers 400 for any invalid request, 404 for a model it does not serve
        status, code = (404, "model_not_found") if param == "model" else (400, "invalid_value")
    if status == 401:
        code = "invalid_api_key"
    body = openai_error_body(status, api_error.message, param=param, code=code)
    return body, status, api_error.headers


OPENAI_ERRORS = {
    400: "Invalid request (OpenAI's shape; `param` names the field); a video model: code model_not_image "
    "(POST /v1/videos makes videos).",
    401: "Missing or invalid API key, or it was revoked while the call waited.",
    404: "No worker serves the model (code model_not_found), or the job was deleted while the call waited "
    "(job_deleted).",
    413: "Request body too large, or a form of too many parts (STEPWISE_MAX_FORM_PARTS).",
    415: "Not JSON (generations) or not multipart (edits).",
    429: "The queue or the tenant's quota is full.",
    500: "The job failed.",
    503: "Redis, storage or the queue is unavailable, or this API process is shutting down while the call waited "
    "(shutting_down: the job goes on, Location).",
    504: "The job did not end within STEPWISE_IMAGES_WAIT_SECONDS; it goes on (Location).",
}
IMAGES = {200: Answer("The images.", OpenAIImagesResponse)}


@bp.post("/generations")
@documented(
    "OpenAI's create image: one job, waited for.",
    body=OpenAIImageGeneration,
    responses=IMAGES,
    errors=OPENAI_ERRORS,
    error_model=OpenAIError,
)
def openai_image_generations():
    return submit_and_wait(translate(read_json(), images={}))


@bp.post("/edits")
@documented(
    "OpenAI's create image edit: image to image, or inpainting with a mask; waited for.",
    form=OpenAIImageEdit,
    responses=IMAGES,
    errors=OPENAI_ERRORS,
    error_model=OpenAIError,
)
def openai_image_edits():
    # the most images a job reads, and a mask; not STEPWISE_MAX_BODY_BYTES
    limit = (MAX_REFERENCE_IMAGES + 1) * MAX_IMAGE_BYTES + MULTIPART_OVERHEAD_BYTES
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, "payload_too_large", f"image: at most {MAX_IMAGE_BYTES} bytes each", field="image")
    request.max_content_length = limit
    if request.mimetype != "multipart/form-data":
        raise ApiError(415, "unsupported_media_type", "send the edit as multipart/form-data (image, prompt, ...)")
    form, files = read_form()
    fields: dict[str, Any] = {name: value for name, value in form.items() if name != "image[]"}
    return submit_and_wait(translate(fields, images=edit_images(files), is_form=True))


def submit_and_wait(translation: JobTranslation):
    settings = get_settings()
    model = translation.job.get("model", settings.default_model)
    check_model_kind(model, get_fleet().family_for(model), wants_video=False)
    job_id = submit_job(translation.job).record.job_id
    seconds = settings.images_wait_seconds
    return waited(job_id, seconds, lambda end: answer(job_id, translation, end))


def answer(job_id: str, translation: JobTranslation, end: WaitEnd) -> Rendered:
    store = get_job_store()
    record = store.get(job_id)
    if record is None:  # deleted (DELETE /v1/jobs/{id}) while this call waited: as GET /v1/jobs/{id} says, 404
        how = "was deleted while this request waited for it" if store.was_deleted(job_id) else "no longer exists"
        return error_rendered(404, f"job {job_id} {how}", code="job_deleted")
    if record.state is JobState.SUCCEEDED:
        return json_rendered(200, images_response(record, translation.response_format), [])
    where = [("Location", job_url(job_id))]
    goes_on = f"job {job_id} goes on: GET /v1/jobs/{job_id} (or its /events) shows when it is done"
    if not record.state.is_terminal and end is WaitEnd.CLOSING:
        message = f"this API process is shutting down before the image was ready; {goes_on}"
        return error_rendered(503, message, code="shutting_down", headers=where)
    if not record.state.is_terminal:
        seconds = get_settings().images_wait_seconds
        message = f"the image was not ready within {seconds:g}s (STEPWISE_IMAGES_WAIT_SECONDS); {goes_on}"
        return error_rendered(504, message, code="timeout", headers=where)
    message = f"job {job_id} {record.state.value}: {record.error_message or record.error_code or ''}".rstrip(": ")
    if record.state is JobState.FAILED and record.error_code == "invalid_params":
        return error_rendered(400, message, code="invalid_params", headers=where)
    status = 500 if record.state is JobState.FAILED else 400
    return error_rendered(status, message, code=record.error_code or record.state.value, headers=where)


def error_rendered(status: int, message: str, *, code: str, headers: list[tuple[str, str]] = []) -> Rendered:  # noqa: B006
    return json_rendered(status, openai_error_body(status, message, code=code), [*NO_RETRY, *headers])


def images_response(record: JobRecord, response_format: str) -> dict[str, Any]:
    params = record.params
    if response_format == "url":
        data = [{"url": url} for url in image_urls(record)]
    else:
        store = get_image_store()
        data = [{"b64_json": base64.b64encode(store.get_bytes(key)).decode("ascii")} for key in record.image_keys]
    return {
        "created": int(record.finished_at or time.time()),
        "data": data,
        "output_format": params.get("output_format", "png"),
        "size": f"{params.get('width')}x{params.get('height')}",
    }
