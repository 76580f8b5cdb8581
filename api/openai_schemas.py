"""The OpenAI images routes' request and response models (api.openai_images).

The request models validate what the routes take (api.openai_fields.translate), and their JSON
schemas are the OpenAPI document's, so the two cannot disagree. Fields stepwise shares with
`POST /v1/jobs` (prompts, model, seed, steps, ...) use JobRequest's own rules (api.schemas).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from api import schemas as S

RESPONSE_FORMATS = ("b64_json", "url")
OUTPUT_FORMATS = ("png", "jpeg", "webp")
SIZE_PATTERN = r"^(auto|[0-9]{1,5}x[0-9]{1,5})$"  # ASCII digits: int() would also read full-width ones


def not_streamed(value: bool) -> bool:
    if value:
        raise ValueError("not supported here: GET /v1/jobs/{job_id}/events streams a job's progress")
    return value


# false, or "false" in a form: stepwise answers once the image is there
NoStream = Annotated[bool, AfterValidator(not_streamed), WithJsonSchema({"const": False})]


class OpenAIImageFields(BaseModel):
    """OpenAI's fields: translated, accepted and ignored (quality, style, user, ...), or refused where stepwise
    cannot honour them (stream, a transparent background); stepwise's own ride along (the SDKs' extra_body).
    Any other name is refused, as OpenAI refuses it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def whole_floats_as_ints(cls, data: Any) -> Any:
        """JSON Schema counts 2.0 as an integer, and so does this API (as api.schemas.JobRequest)."""
        return S.whole_floats_as_ints(data, INTEGER_FIELDS)

    prompt: S.Prompt
    model: S.ModelName | None = Field(None, description="A model a worker serves; default: STEPWISE_MODEL.")
    n: S.NumImages | None = Field(None, description="Images (one job, seeds seed..seed+n-1).")
    size: str | None = Field(None, pattern=SIZE_PATTERN, description="WIDTHxHEIGHT, or auto.")
    response_format: Literal[RESPONSE_FORMATS] | None = Field(  # type: ignore[valid-type]
        None, description="b64_json (default) or url (the job's image URL: presigned on S3, else needs the key)."
    )
    output_format: Literal[OUTPUT_FORMATS] | None = None  # type: ignore[valid-type]
    output_compression: int | None = Field(None, ge=0, le=100, description="JPEG/WebP quality.")
    background: Literal["auto", "opaque"] | None = Field(None, description="These models draw no transparency.")
    stream: NoStream | None = Field(None, description="Not supported: use GET /v1/jobs/{job_id}/events.")
    quality: str | None = Field(None, description="Accepted and ignored, as style, user, moderation ...")
    style: str | None = None
    user: str | None = None
    safety_identifier: str | None = None
    moderation: str | None = None
    complexity: str | None = None
    input_fidelity: str | None = None
    partial_images: int | None = None
    seed: S.Seed | None = Field(None, description="stepwise: as in POST /v1/jobs.")
    negative_prompt: S.NegativePrompt | None = Field(None, description="stepwise.")
    num_inference_steps: S.Steps | None = Field(None, description="stepwise.")
    guidance_scale: S.Guidance | None = Field(None, description="stepwise.")
    sampler: S.Sampler | None = Field(None, description="stepwise.")
    priority: S.Priority | None = Field(None, description="stepwise.")
    strength: S.Strength | None = Field(None, description="stepwise, edits: the fraction of steps run.")
    lora: S.LoraName | None = Field(None, description="stepwise: an adapter name.")
    lora_scale: S.LoraScale | None = Field(None, description="stepwise.")


INTEGER_FIELDS = S.integer_fields(OpenAIImageFields)
# stepwise's own job fields, passed on as they are
EXTENSIONS = (
    "seed",
    "negative_prompt",
    "num_inference_steps",
    "guidance_scale",
    "sampler",
    "priority",
    "strength",
    "lora",
    "lora_scale",
)


class OpenAIImageGeneration(OpenAIImageFields):
    """POST /v1/images/generations: OpenAI's fields (unknown ones are refused, as OpenAI refuses them)."""


def without_nulls(schema: dict[str, Any]) -> None:
    """A form's fields: a part is there with its text, or left out; no part can hold a JSON null."""
    for field in schema["properties"].values():
        options = [option for option in field.pop("anyOf", []) if option.get("type") != "null"]
        if options:
            field.update(options[0] if len(options) == 1 else {"anyOf": options})
        if "default" in field and field["default"] is None:
            del field["default"]


class OpenAIImageEdit(OpenAIImageFields):
    """POST /v1/images/edits, multipart: the image (or several), an optional mask (transparent: edit there), and the
    fields."""

    model_config = ConfigDict(json_schema_extra=without_nulls)

    image: bytes = Field(
        description="PNG, JPEG or WebP. Several (repeated image parts, or image[] as OpenAI's SDKs send a list) "
        "become the job's reference_images, in order, for models that read a list (Qwen-Image-Edit-Plus, FLUX.2).",
        json_schema_extra={"format": "binary"},
    )
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


# The video routes (api.openai_videos): OpenAI's create-video fields, as the open engines serve them.
SECONDS_PATTERN = r"^[0-9]{1,3}(\.[0-9]{1,3})?$"  # a string of seconds, as the SDKs send it ("4"), or a number
MAX_SECONDS = 600
VIDEO_STATUSES = ("queued", "in_progress", "completed", "failed")


def seconds_from_text(value: Any) -> Any:
    """`seconds` is one number, sent as a JSON number or as the text the SDKs send ("4"): the text becomes the
    number here, so "0" and 0 meet the same rule and a refusal names `seconds`, not a branch of a union."""
    if isinstance(value, bool):
        raise ValueError('must be a number of seconds, such as 4 or "4"')
    if isinstance(value, str):
        if not re.fullmatch(SECONDS_PATTERN, value):
            raise ValueError('must be a number of seconds, such as 4 or "4" (at most 3 decimals)')
        return float(value)
    return value


Seconds = Annotated[
    float,
    BeforeValidator(seconds_from_text),
    Field(gt=0, le=MAX_SECONDS),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS},
                {"type": "string", "pattern": SECONDS_PATTERN},
            ]
        }
    ),
]


class OpenAIVideoFields(BaseModel):
    """POST /v1/videos: OpenAI's fields (prompt, model, size, seconds, input_reference) and stepwise's (num_frames,
    fps, seed, ...). Any other name is refused, as OpenAI refuses it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def whole_floats_as_ints(cls, data: Any) -> Any:
        return S.whole_floats_as_ints(data, VIDEO_INTEGER_FIELDS)

    prompt: S.Prompt
    model: S.ModelName | None = Field(None, description="A video model a worker serves; default: STEPWISE_MODEL.")
    size: str | None = Field(None, pattern=SIZE_PATTERN, description="WIDTHxHEIGHT, or auto (the family's).")
    seconds: Seconds | None = Field(
        None,
        description="Duration: num_frames = seconds x fps, rounded to the family's rule (Wan: 4k+1 frames). "
        "Not with num_frames. Default: the family's num_frames.",
    )
    num_frames: int | None = Field(None, ge=1, le=S.P.MAX_NUM_FRAMES, description="stepwise: as in POST /v1/jobs.")
    fps: int | None = Field(None, ge=1, le=S.P.MAX_FPS, description="stepwise: frames per second.")
    seed: S.Seed | None = Field(None, description="stepwise.")
    negative_prompt: S.NegativePrompt | None = Field(None, description="stepwise.")
    num_inference_steps: S.Steps | None = Field(None, description="stepwise.")
    guidance_scale: S.Guidance | None = Field(None, description="stepwise.")
    guidance_scale_2: S.Guidance | None = Field(None, description="stepwise: a two-expert model's low-noise guidance.")
    sampler: S.Sampler | None = Field(None, description="stepwise.")
    priority: S.Priority | None = Field(None, description="stepwise.")
    input_reference: str | dict[str, str] | None = Field(
        None,
        description="JSON: the first frame (image-to-video models), as a data URI, an upload id or an allowed URL, "
        'or {"image_url": ...} / {"file_id": "upl_..."}; multipart: a file part.',
    )


VIDEO_INTEGER_FIELDS = S.integer_fields(OpenAIVideoFields)
VIDEO_EXTENSIONS = (  # stepwise's own job fields, passed on as they are
    "num_frames",
    "fps",
    "seed",
    "negative_prompt",
    "num_inference_steps",
    "guidance_scale",
    "guidance_scale_2",
    "sampler",
    "priority",
)


class OpenAIVideoCreate(OpenAIVideoFields):
    """POST /v1/videos as JSON."""


class OpenAIVideoCreateForm(OpenAIVideoFields):
    """POST /v1/videos as multipart/form-data (what the openai SDK sends): the fields as text parts, and
    input_reference as a file part (PNG, JPEG or WebP)."""

    model_config = ConfigDict(json_schema_extra=without_nulls)

    input_reference: bytes | None = Field(  # type: ignore[assignment]
        None, description="The first frame (image-to-video models).", json_schema_extra={"format": "binary"}
    )


class VideoErrorView(BaseModel):
    code: str
    message: str


class OpenAIVideo(BaseModel):
    id: str = Field(description="The job's id (GET /v1/jobs/{job_id} shows the job).")
    object: Literal["video"]
    status: Literal[VIDEO_STATUSES]  # type: ignore[valid-type]
    progress: int = Field(description="Percent of the denoising steps done (100 once completed).")
    created_at: int = Field(description="Unix seconds.")
    completed_at: int | None = Field(description="Unix seconds, once it ended.")
    error: VideoErrorView | None
    model: str
    prompt: str
    size: str = Field(description="WIDTHxHEIGHT.")
    seconds: str = Field(description="Its duration: (num_frames - 1) / fps, as the request's seconds round to.")
    num_frames: int
    fps: int
    seed: int


class OpenAIVideoList(BaseModel):
    object: Literal["list"]
    data: list[OpenAIVideo] = Field(description="Newest first.")
    has_more: bool
    first_id: str | None
    last_id: str | None = Field(description="Pass as `after` for the next page.")


class OpenAIVideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"]
    deleted: bool


class VideoListQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    after: str | None = Field(None, min_length=1, max_length=128, description="`last_id` of the previous page.")
    limit: int = Field(20, ge=1, le=100, description="Page size.")
    order: Literal["desc"] = Field("desc", description="Newest first (the only order).")


class VideoContentQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    variant: Literal["video"] = Field("video", description="The video (no thumbnail or spritesheet is made).")
