"""The OpenAPI document's parts for waiting and streaming: `Prefer: wait`, the event stream, and the
OpenAI images routes (api.openapi calls `add_live_paths`).

The OpenAI request models here document what api.openai_fields accepts; a test holds their
fields equal to its lists, so the two cannot drift.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import core.params as P
from api.openai_fields import OUTPUT_FORMATS, RESPONSE_FORMATS
from api.waiting import MAX_WAIT_SECONDS
from storage.job_events import EVENT_ID
from storage.job_record import TERMINAL_STATE_NAMES

# What api.waiting.prefer_wait takes: preferences separated by commas, each a token and its ;parameters; the
# first `wait` token must be bare or `wait=N` with N a positive integer (quotes allowed), and every other
# preference is ignored (RFC 7240).
_S = r"\s*"
_NOT_WAIT = rf"(?!{_S}wait{_S}(?:={_S}[^\s,;]*{_S})?(?:;|,|$))[^,]*"
_WAIT = rf'{_S}wait{_S}(?:={_S}"*0*[1-9][0-9]*"*)?{_S}(?:;[^,]*)?'
PREFER_PATTERN = rf"^(?:{_NOT_WAIT},)*(?:{_NOT_WAIT}|{_WAIT}(?:,.*)?)$"
PREFER = {
    "name": "Prefer",
    "in": "header",
    "required": False,
    "description": "`wait` or `wait=N` (RFC 7240): hold the answer until the job ends, at most N "
    f"(1-{MAX_WAIT_SECONDS}; more is {MAX_WAIT_SECONDS}) seconds; 200 with the ended job, or 202 with it as it "
    "is then. Other preferences are ignored; a malformed wait value gets 422.",
    "schema": {"type": "string", "pattern": PREFER_PATTERN},
}
LAST_EVENT_ID = {
    "name": "Last-Event-ID",
    "in": "header",
    "required": False,
    "description": "Resume after this event (its `id`); what a reconnecting EventSource sends.",
    "schema": {"type": "string", "maxLength": 41, "pattern": rf"^\s*{EVENT_ID.pattern}\s*$"},
}
# One event of the stream, as schemathesis and other tools read text/event-stream: its fields.
EVENT = {
    "type": "object",
    "properties": {
        "event": {
            "type": "string",
            "enum": ["queued", "started", "progress", "preview", *sorted(TERMINAL_STATE_NAMES)],
        },
        "data": {"type": "string", "description": "JSON: the job's view, or the event's details."},
        "id": {"type": "string", "pattern": f"^{EVENT_ID.pattern}$"},
        "retry": {"type": "integer", "minimum": 0},
    },
}
PREFERENCE_APPLIED = {"Preference-Applied": {"description": "wait=N: the wait applied.", "schema": {"type": "string"}}}
LOCATION = {"Location": {"description": "The job's URL.", "schema": {"type": "string"}}}


class OpenAIImageFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=P.MAX_PROMPT_CHARS)
    model: str | None = Field(None, description="A model a worker serves; default: STEPWISE_MODEL.")
    n: int | None = Field(None, ge=1, le=P.MAX_NUM_IMAGES, description="Images (one job, seeds seed..seed+n-1).")
    size: str | None = Field(None, pattern=r"^(auto|\d{1,5}x\d{1,5})$", description="WIDTHxHEIGHT, or auto.")
    response_format: Literal[RESPONSE_FORMATS] | None = Field(  # type: ignore[valid-type]
        None, description="b64_json (default) or url (the job's image URL: presigned on S3, else needs the key)."
    )
    output_format: Literal[OUTPUT_FORMATS] | None = None  # type: ignore[valid-type]
    output_compression: int | None = Field(None, ge=0, le=100, description="JPEG/WebP quality.")
    background: Literal["auto", "opaque"] | None = None
    stream: Literal[False] | None = Field(None, description="Not supported: use GET /v1/jobs/{job_id}/events.")
    quality: str | None = Field(None, description="Accepted and ignored, as style, user, moderation ...")
    style: str | None = None
    user: str | None = None
    safety_identifier: str | None = None
    moderation: str | None = None
    complexity: str | None = None
    input_fidelity: str | None = None
    partial_images: int | None = None
    seed: int | None = Field(None, ge=0, le=P.MAX_SEED, description="stepwise: as in POST /v1/jobs.")
    negative_prompt: str | None = Field(None, max_length=P.MAX_PROMPT_CHARS, description="stepwise.")
    num_inference_steps: int | None = Field(None, ge=P.MIN_STEPS, le=P.MAX_STEPS, description="stepwise.")
    guidance_scale: float | None = Field(None, ge=P.MIN_GUIDANCE, le=P.MAX_GUIDANCE, description="stepwise.")
    sampler: Literal[P.SAMPLERS] | None = Field(None, description="stepwise.")  # type: ignore[valid-type]
    priority: Literal[P.PRIORITIES] | None = Field(None, description="stepwise.")  # type: ignore[valid-type]
    strength: float | None = Field(None, gt=0, le=1, description="stepwise, edits: the fraction of steps run.")
    lora: str | None = Field(None, description="stepwise: an adapter name.")
    lora_scale: float | None = Field(None, description="stepwise.")


class OpenAIImageGeneration(OpenAIImageFields):
    """POST /v1/images/generations: OpenAI's fields (unknown ones are refused, as OpenAI refuses them)."""


class OpenAIImageEdit(OpenAIImageFields):
    """POST /v1/images/edits, multipart: the image, an optional mask (transparent: edit there), and the fields."""

    image: bytes = Field(description="PNG, JPEG or WebP.", json_schema_extra={"format": "binary"})
    mask: bytes | None = Field(None, description="With an alpha channel.", json_schema_extra={"format": "binary"})


class OpenAIImage(BaseModel):
    b64_json: str | None = None
    url: str | None = None


class OpenAIImagesResponse(BaseModel):
    created: int = Field(description="Unix seconds.")
    data: list[OpenAIImage]
    output_format: str
    size: str


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, rate_limit_error or server_error.")
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


def add_live_paths(b: Any, paths: dict[str, Any]) -> None:
    """`b`: api.openapi's DocumentBuilder."""
    submit = paths["/v1/jobs"]["post"]
    submit["parameters"].append(PREFER)
    submit["responses"]["202"]["headers"] = {**LOCATION, **PREFERENCE_APPLIED}
    submit["responses"]["200"] = b.response(
        "With Prefer: wait, the job ended within the wait.", b.models.JobView, PREFERENCE_APPLIED
    )
    paths["/v1/jobs/{job_id}/events"] = {
        "get": {
            "operationId": "jobEvents",
            "summary": "Server-sent events: queued (with its position), started, progress, preview, then the end "
            "state with the job's view; then the stream ends.",
            "parameters": [b.job_id, LAST_EVENT_ID],
            "responses": {
                "200": {
                    "description": "text/event-stream (docs/api.md#event-stream).",
                    "content": {"text/event-stream": {"schema": EVENT}},
                },
                **b.errors(401, 404, 422, 503),
            },
        }
    }
    openai_errors = {
        str(status): b.response(meaning, OpenAIError)
        for status, meaning in (
            (400, "Invalid request (OpenAI's shape; `param` names the field)."),
            (401, "Missing or invalid API key."),
            (404, "No worker serves the model (code model_not_found)."),
            (413, "Request body too large."),
            (415, "Not JSON (generations) or not multipart (edits)."),
            (429, "The queue or the tenant's quota is full."),
            (500, "The job failed."),
            (503, "Redis, storage or the queue is unavailable."),
            (504, "The job did not end within STEPWISE_IMAGES_WAIT_SECONDS; it goes on (Location)."),
        )
    }
    images = b.response("The images.", OpenAIImagesResponse)
    paths["/v1/images/generations"] = {
        "post": {
            "operationId": "openaiImageGenerations",
            "summary": "OpenAI's create image: one job, waited for.",
            "requestBody": b.json_body(OpenAIImageGeneration),
            "responses": {"200": images, **openai_errors},
        }
    }
    paths["/v1/images/edits"] = {
        "post": {
            "operationId": "openaiImageEdits",
            "summary": "OpenAI's create image edit: image to image, or inpainting with a mask; waited for.",
            "requestBody": {
                "required": True,
                "content": {"multipart/form-data": {"schema": b.ref(OpenAIImageEdit, "validation")}},
            },
            "responses": {"200": images, **openai_errors},
        }
    }
