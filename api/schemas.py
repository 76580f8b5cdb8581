"""Request and response models. Their JSON schemas are the OpenAPI document's schemas.

Request limits come from the engine's constants in `core.params`, so the document
shows the real limits; `GenerationParams` still validates every job afterwards, so the
API and the engine cannot disagree about what a valid job is.
"""

from __future__ import annotations

import dataclasses
import re
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SkipValidation,
    WithJsonSchema,
    model_validator,
)

import core.params as P
import core.step_cache as step_cache
from core.errors import InvalidParamsError
from core.families import FAMILIES
from core.image_inputs import MAX_DATA_URI_CHARS, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, RESIZE_MODES
from storage.job_record import JOB_STATE_NAMES, REQUEUE_REASONS
from storage.tenant_listing import CURSOR_OR_NONE_PATTERN
from storage.webhooks import DEFAULT_EVENTS as DEFAULT_WEBHOOK_EVENTS
from storage.webhooks import EVENTS as WEBHOOK_EVENTS

WebhookEvent = Literal[WEBHOOK_EVENTS]  # type: ignore[valid-type]
JobStateName = Literal[JOB_STATE_NAMES]  # type: ignore[valid-type]
Sampler = Literal[P.SAMPLERS]  # type: ignore[valid-type]
Priority = Literal[P.PRIORITIES]  # type: ignore[valid-type]
RequeueReason = Literal[REQUEUE_REASONS]  # type: ignore[valid-type]
# An image field's three forms: an upload id, a base64 data URI (its media type and line wrapping as encoders
# send them: core.image_inputs), an http(s) URL (fetched from hosts the operator allows). Which bytes,
# uploads and hosts are acceptable no pattern can say: those get a 422 naming the field.
IMAGE_REFERENCE_PATTERN = (
    r"^(?:upl_[0-9a-f]{32}"
    r"|[dD][aA][tT][aA]:(?:[\w.+-]+/[\w.+-]+)?(?:;[\w.+-]+=[^;,]*)*;[bB][aA][sS][eE]64,[\s\S]*"
    r"|[hH][tT][tT][pP][sS]?://[\s\S]+)$"
)
ImageReference = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_DATA_URI_CHARS,
        json_schema_extra={"pattern": IMAGE_REFERENCE_PATTERN},  # checked by core.image_inputs
    ),
]
ResizeMode = Literal[RESIZE_MODES]  # type: ignore[valid-type]
OutputFormat = Literal[tuple(P.OUTPUT_FORMATS)]  # type: ignore[valid-type]

# Rules of the fields JobRequest shares with the OpenAI images fields (api.openai_schemas), each in one place.
# Patterns are for what core.params checks: no NUL (nor control characters in a model name), not blank.
Prompt = Annotated[
    str,
    Field(min_length=1, max_length=P.MAX_PROMPT_CHARS, json_schema_extra={"pattern": r"^[^\x00]*[^\x00\s][^\x00]*$"}),
]
NegativePrompt = Annotated[str, Field(max_length=P.MAX_PROMPT_CHARS, json_schema_extra={"pattern": r"^[^\x00]*$"})]
ModelName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=500,
        json_schema_extra={"pattern": r"^[^\x00-\x1f\x7f-\x9f]*[^\x00-\x1f\x7f-\x9f\s][^\x00-\x1f\x7f-\x9f]*$"},
    ),
]
Seed = Annotated[int, Field(ge=0, le=P.MAX_SEED)]
NumImages = Annotated[int, Field(ge=1, le=P.MAX_NUM_IMAGES)]
Steps = Annotated[int, Field(ge=P.MIN_STEPS, le=P.MAX_STEPS)]
Guidance = Annotated[float, Field(ge=P.MIN_GUIDANCE, le=P.MAX_GUIDANCE)]
Strength = Annotated[float, Field(gt=0, le=1)]
LoraName = Annotated[  # checked by api.job_validation.check_lora
    str, Field(min_length=1, max_length=100, json_schema_extra={"pattern": f"^{P.LORA_NAME_PATTERN.pattern}$"})
]
LoraScale = Annotated[float, Field(ge=-P.MAX_LORA_SCALE, le=P.MAX_LORA_SCALE)]


def cache_setting(value: Any) -> Any:
    """A job's `cache` as core.step_cache reads it (one check, whose message names the field's rule); the
    job's family is checked with the rest of its params."""
    try:
        step_cache.check_cache(value, "any", "any")
    except InvalidParamsError as e:
        raise ValueError(e.message) from None
    return value


CacheSetting = Annotated[
    Any,
    BeforeValidator(cache_setting),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "enum": [step_cache.CACHE_OFF, *step_cache.PRESET_NAMES]},
                {"type": "number", "exclusiveMinimum": 0, "maximum": step_cache.MAX_THRESHOLD},
                {"type": "null"},
            ]
        }
    ),
]
# Shown defaults are the SD family's; a field left out takes the job's model family's (core.families).
_SD = FAMILIES["sd"]

# Fields of the request that are generation parameters (the rest is about the job itself).
PARAM_FIELDS = tuple(field.name for field in dataclasses.fields(P.GenerationParams))


MAX_DEADLINE_SECONDS = 30 * 24 * 3600  # a deadline at most 30 days ahead: any later is no deadline at all
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")


def rfc3339_only(value: Any) -> Any:
    """pydantic would also take unix seconds (as a number or a string of digits); the API takes one form."""
    if not isinstance(value, str) or not RFC3339.fullmatch(value):
        raise ValueError("must be an RFC 3339 time with an offset, e.g. 2030-01-01T12:00:00Z")
    return value


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def needs(field: str, other: str, *, unless: list[Any] | None = None) -> dict[str, Any]:
    """JSON Schema: `field`, unless null (or one of `unless`), needs `other` as a string."""
    return {
        "anyOf": [
            {"properties": {field: {"enum": [None, *(unless or [])]}}},
            {"required": [other], "properties": {other: {"type": "string"}}},
        ]
    }


# Fields that need another (core.params, api.job_validation), for the OpenAPI document.
JOB_DEPENDENCIES = {
    "mask_image": needs("mask_image", "init_image"),
    "strength": needs("strength", "init_image", unless=[1]),
    "webhook_events": needs("webhook_events", "webhook_url"),
}


class JobRequest(StrictModel):
    """One image-generation job. Unknown fields are refused."""

    model_config = ConfigDict(json_schema_extra={"dependentSchemas": JOB_DEPENDENCIES})  # type: ignore[dict-item]

    @model_validator(mode="before")
    @classmethod
    def whole_floats_as_ints(cls, data: Any) -> Any:
        """JSON Schema counts 49.0 as an integer, and so does this API (strict otherwise: "49" is refused)."""
        return whole_floats_as_ints(data, INTEGER_FIELDS)

    prompt: Prompt = Field(description="What to draw.")
    negative_prompt: NegativePrompt = Field("", description="What to steer away from.")
    height: int = Field(
        _SD.default_size,
        ge=P.MIN_SIZE,
        le=P.MAX_SIZE,
        multiple_of=P.SIZE_MULTIPLE,
        description=f"Pixels; height*width at most {P.MAX_PIXELS}; a multiple of 16 for FLUX "
        "and Z-Image. Default: the model family's.",
    )
    width: int = Field(
        _SD.default_size,
        ge=P.MIN_SIZE,
        le=P.MAX_SIZE,
        multiple_of=P.SIZE_MULTIPLE,
        description="Pixels. Default: the model family's.",
    )
    num_inference_steps: Steps = Field(_SD.default_steps, description="Denoising steps. Default: the model family's.")
    guidance_scale: Guidance = Field(
        _SD.default_guidance,
        description="SD/SDXL: classifier-free guidance, at most 1.0 turns it off; Z-Image: 0 turns it off; "
        "FLUX-dev: the embedded guidance value. Default: the model family's (7.5 for SD).",
    )
    seed: Seed | None = Field(None, description="Omit for a random seed (recorded on the job).")
    sampler: Sampler | None = Field(
        None,
        description="Sampler for the denoise loop (the flow-matching image families: euler only; Wan: unipc or "
        "euler). Default: the model family's (euler; Wan: unipc).",
    )
    num_images: NumImages = Field(1, description="Images with seeds seed..seed+n-1.")
    model: ModelName = Field(  # type: ignore[assignment]
        None, description="Model to run; default: the model the service serves (STEPWISE_MODEL)."
    )
    num_frames: int | None = Field(
        None,
        ge=1,
        le=P.MAX_NUM_FRAMES,
        description="Video models: frames of the video, by the family's rule (Wan: 4k+1, at most "
        f"{FAMILIES['wan'].max_num_frames}); num_frames*height*width at most {P.MAX_VIDEO_PIXELS}. Image models: 1. "
        "Default: the model family's (Wan: 33; images: 1).",
    )
    fps: int | None = Field(
        None,
        ge=1,
        le=P.MAX_FPS,
        description="Video models: the video's frame rate (playback only: it changes no frame). Default: the model "
        "family's (Wan: 16). Refused for image models.",
    )
    guidance_scale_2: Guidance | None = Field(
        None,
        description="Two-expert video models (Wan 2.2 A14B): the low-noise expert's guidance. Default: "
        "guidance_scale. Refused for models with one expert.",
    )
    lora: LoraName | None = Field(
        None,
        description=(
            "Name of a LoRA adapter: your own upload (PUT /v1/loras/{name}) or one of the operator's (GET /v1/loras). "
            "Jobs with different adapters share forwards."
        ),
    )
    lora_scale: LoraScale = Field(1.0, description="The adapter's strength (0: none; 1: as trained).")
    init_image: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_DATA_URI_CHARS,
        json_schema_extra={"pattern": IMAGE_REFERENCE_PATTERN},  # checked by core.image_inputs
        description="Image-to-image: a data:image/png|jpeg|webp;base64,... URI, an upload id (POST /v1/uploads), "
        "or an http(s) URL on a host the operator allows (STEPWISE_IMAGE_URL_HOSTS; fetched at submit). "
        f"At most {MAX_IMAGE_BYTES} bytes and {MAX_IMAGE_PIXELS} pixels. "
        "height and width default to the image's size.",
    )
    mask_image: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_DATA_URI_CHARS,
        json_schema_extra={"pattern": IMAGE_REFERENCE_PATTERN},  # checked by core.image_inputs
        description="Inpainting: white repaints, black keeps; the init_image's size. Needs init_image. "
        "The same forms as init_image.",
    )
    reference_images: list[ImageReference] | None = Field(
        None,
        # the families' own limits (at most MAX_REFERENCE_IMAGES) are core.params' rule, which names the item
        json_schema_extra={"maxItems": P.MAX_REFERENCE_IMAGES},
        description="Several input images, in order, each in any form init_image takes, for the models that read "
        "a list: Qwen-Image-Edit-Plus (1 to 3: the images to edit from, required), FLUX.2 and FLUX.2 [klein] (up "
        f"to {P.MAX_REFERENCE_IMAGES} reference images). There init_image is the one-image form: give one or the "
        "other. Other models refuse it. A refusal names the item: reference_images[i].",
    )
    strength: Strength | None = Field(
        None,
        description="With init_image: the fraction of the steps run, from the end (0 < s <= 1). "
        "Default 0.8, or 1.0 with a mask.",
    )
    resize_mode: ResizeMode = Field(
        "none",
        description="An input image whose size differs from the job's: none (an error), stretch, or crop "
        "(cover, then center-crop).",
    )
    output_format: OutputFormat | None = Field(  # type: ignore[valid-type]
        None,
        description="Images: png, jpeg or webp (default png). Videos (video models): mp4 (H.264, the default), webm "
        "(VP9) or gif; a one-frame job of a video model may also be an image.",
    )
    output_quality: int = Field(
        P.DEFAULT_OUTPUT_QUALITY, ge=1, le=100, description="JPEG/WebP quality (1-100); PNG and videos ignore it."
    )
    cache: CacheSetting = Field(
        None,
        description=f"Step caching: {step_cache.CACHE_OFF}, a preset ({', '.join(step_cache.PRESET_NAMES)}: fewer "
        "denoiser FLOPs "
        "for a small quality cost), or a threshold (0 < t <= 1: the relative change of an early feature under "
        "which a step reuses the job's cache). Cached and uncached jobs share forwards. Every family. "
        f"Default: the worker's (STEPWISE_STEP_CACHE, {step_cache.CACHE_OFF} unless set).",
    )
    webhook_url: str | None = Field(
        None, min_length=1, max_length=2048, description="http(s) URL called on the events in webhook_events."
    )
    webhook_events: list[WebhookEvent] | None = Field(
        None,
        min_length=1,
        max_length=len(WEBHOOK_EVENTS),
        description=f"Events to deliver, of {', '.join(WEBHOOK_EVENTS)}; default {', '.join(DEFAULT_WEBHOOK_EVENTS)} "
        "(progress only when asked: at most one per second per job, the latest wins). Needs webhook_url.",
    )
    deadline: Annotated[AwareDatetime, BeforeValidator(rfc3339_only), Field(strict=False)] | None = Field(
        None,
        description="RFC 3339 time with an offset (unix numbers are refused), at most 30 days ahead; "
        "a job not started by then ends `expired`.",
    )
    priority: Priority | None = Field(
        None,
        description="high, normal (the default) or low: taken from the queue and admitted by the engine "
        "before lower ones; a tenant may be limited to a maximum (STEPWISE_TENANT_MAX_PRIORITY).",
    )
    complete_by: Annotated[AwareDatetime, BeforeValidator(rfc3339_only), Field(strict=False)] | None = Field(
        None,
        description="When the job should be finished: RFC 3339 with an offset, in the future, at most 30 days "
        "ahead. Among jobs of one priority the worker runs first the one with the least slack (time left minus "
        "its estimated remaining work); a job that cannot make it is reported `late`, never failed for it. "
        "Not with slo_seconds.",
    )
    slo_seconds: float | None = Field(
        None,
        gt=0,
        le=P.MAX_FINISH_BY_SECONDS,
        description="complete_by as seconds after the job is submitted. Not with complete_by.",
    )

    preview_every: int | None = Field(
        None,
        ge=0,
        le=P.MAX_STEPS,
        description="A live preview (a small approximate image, on GET /v1/jobs/{job_id}/events) every this many "
        "steps of its first image; 0: none. Default: the worker's STEPWISE_PREVIEW_EVERY (0, none, unless set). "
        "At most 256 px on the long side. The image is unchanged.",
    )

    def params_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in PARAM_FIELDS if name in self.model_fields_set}


def integer_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields whose JSON type is integer (or integer or null)."""
    return frozenset(name for name, field in model.model_fields.items() if is_integer(field.annotation))


def is_integer(annotation: Any) -> bool:
    if annotation is int:
        return True
    if get_origin(annotation) is Annotated:
        return is_integer(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return any(is_integer(option) for option in get_args(annotation) if option is not type(None))
    return False


def whole_floats_as_ints(data: Any, names: frozenset[str]) -> Any:
    if not isinstance(data, dict):
        return data
    return {
        name: int(value)
        if name in names and isinstance(value, float) and value.is_integer() and abs(value) < 2**63
        else value
        for name, value in data.items()
    }


INTEGER_FIELDS = integer_fields(JobRequest)


class BatchRequest(StrictModel):
    """Up to STEPWISE_MAX_BATCH_JOBS jobs. Items are validated one by one, each with its own result."""

    jobs: list[SkipValidation[JobRequest]] = Field(min_length=1)
    priority: Priority | None = Field(None, description="Priority of the items that do not name their own.")


class ListQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown query parameter is refused, as a body field is

    state: JobStateName | None = Field(None, description="Only jobs in this state.")
    limit: int = Field(20, ge=1, le=100, description="Page size.")
    cursor: str | None = Field(  # checked by storage.tenant_listing.decode_cursor
        None,
        max_length=80,
        json_schema_extra={"pattern": CURSOR_OR_NONE_PATTERN},
        description="`next_cursor` of the previous page.",
    )


class ImageQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown query parameter is refused, as a body field is

    index: int = Field(0, ge=0, lt=P.MAX_NUM_IMAGES, description="Which image of a num_images>1 job.")


class ScalingQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown query parameter is refused, as a body field is

    model: str = Field(min_length=1, max_length=500, description="The model whose load to read, e.g. builtin:tiny.")
