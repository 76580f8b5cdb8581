"""Generation parameters: the one place where user input is validated.

Everything that reaches the engine, the worker or the API passes through
`GenerationParams`, so the rules below are the only rules. Each violation raises
`InvalidParamsError` naming the field and the bad value. Torch-free: the API, storage,
the worker and the engine all read it (`from batching import GenerationParams` hands it to the engine's users).
"""

from __future__ import annotations

import dataclasses
import math
import re
import secrets
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidParamsError
from core.families import FALLBACK_FAMILY, FAMILIES, FamilySpec, family_of_model
from core.image_inputs import REFERENCE_IMAGES, RESIZE_MODES, check_reference, image_size, is_data_uri, listed_images
from core.output_formats import DEFAULT_IMAGE_FORMAT, DEFAULT_VIDEO_FORMAT, OUTPUT_FORMATS, VIDEO_FORMATS
from core.step_cache import CacheSetting, check_cache
from settings.table import DEVICE

SAMPLERS = tuple(dict.fromkeys(name for spec in FAMILIES.values() for name in spec.samplers))  # any family's
DEFAULT_MODEL = "builtin:tiny"  # of a GenerationParams built in Python (the engine's own default model)
PRIORITIES = ("high", "normal", "low")  # a job's priority, highest first: queue order and engine admission

MIN_SIZE = 64
MAX_SIZE = 2048
SIZE_MULTIPLE = min(spec.size_multiple for spec in FAMILIES.values())  # the loosest; families may ask more
MAX_PIXELS = 2048 * 2048
MIN_STEPS = 1
MAX_STEPS = 200
MAX_PROMPT_CHARS = 2000
MIN_GUIDANCE = 0.0
MAX_GUIDANCE = max(spec.max_guidance for spec in FAMILIES.values())  # the loosest; families may ask less
MAX_SEED = 2**63 - 1
MAX_NUM_IMAGES = 8
MAX_REFERENCE_IMAGES = max(spec.max_reference_images for spec in FAMILIES.values())  # the loosest
MAX_NUM_FRAMES = max(spec.max_num_frames for spec in FAMILIES.values())  # the loosest; families may ask less
MAX_VIDEO_PIXELS = 161 * 1280 * 720  # frames x height x width of one video: ten seconds of 720p at 16 fps
MAX_FPS = 120
MAX_LORA_SCALE = 4.0
MIN_EDIT_IMAGE_SIDE = 32  # an edit image's sides once its pipeline sizes it (a thinner one would round to none)
DEFAULT_OUTPUT_QUALITY = 90  # JPEG/WebP quality when the job names none; PNG and the video formats ignore it
DEFAULT_IMG2IMG_STRENGTH = 0.8  # diffusers' img2img default; a job with a mask defaults to 1.0 (its inpaint default)
# A LoRA adapter is `NAME` (an operator adapter) or `tenants/TENANT/NAME` (a tenant's upload, as the
# worker resolves it); the API lets users name only `NAME`. The store holds `<key>.safetensors`.
LORA_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
LORA_KEY_PATTERN = re.compile(r"(tenants/[A-Za-z0-9_-]{1,64}/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 and C1: what no model name, path or repo id holds


# Device names an engine accepts (EngineConfig.device, STEPWISE_DEVICE, --device).
DEVICE_PATTERN = re.compile(DEVICE.pattern or "")


# What `stepwise up` (so `make run`) and `stepwise generate` serve when STEPWISE_MODEL is unset: a trained
# model that draws its prompts (docs/shapes.md). A bare worker or API serves STEPWISE_MODEL's default.
SHOWCASE_MODEL = "builtin:shapes"


@dataclass(frozen=True)
class GenerationParams:
    prompt: str
    negative_prompt: str = ""
    height: int = None  # type: ignore[assignment]  # None: the model family's default (core.families)
    width: int = None  # type: ignore[assignment]  # None: the family's default
    num_inference_steps: int = None  # type: ignore[assignment]  # None: the family's default
    guidance_scale: float = None  # type: ignore[assignment]  # None: the family's default; its meaning is the family's
    seed: int | None = None  # None: a random seed is drawn and recorded
    sampler: str = None  # type: ignore[assignment]  # None: "euler"
    num_images: int = 1  # N images become N samples with seeds seed..seed+N-1
    model: str = DEFAULT_MODEL
    num_frames: int = None  # type: ignore[assignment]  # None: the family's default (1 for image families); video
    # families take num_frames by their VAE's rule (Wan: 4k+1)
    fps: int | None = None  # a video's frame rate (playback only); None: the family's default for video families,
    # none for image families (and for a folder model's job, whose family is known at submit: its default then)
    guidance_scale_2: float | None = None  # two-expert models (Wan 2.2 A14B): the low-noise expert's guidance;
    # None: guidance_scale, as the pipeline defaults it
    lora: str | None = None  # LoRA adapter in the store (LORA_KEY_PATTERN); None: the base model
    lora_scale: float = 1.0  # the adapter's strength; rows with different adapters and scales share a forward
    init_image: str | None = None  # data: URI or upload id (core.image_inputs); None: text-to-image
    mask_image: str | None = None  # white = repaint; needs init_image of the same size
    reference_images: tuple[str, ...] | None = None  # several input images in order, each a data: URI or upload id,
    # for families that take a list (FamilySpec.max_reference_images; init_image is its one-image form); a list
    # given is kept as a tuple, an empty one as None
    strength: float = None  # type: ignore[assignment]  # None: 0.8 with init_image, 1.0 with a mask or without images
    resize_mode: str = "none"  # core.image_inputs.RESIZE_MODES
    output_format: str = None  # type: ignore[assignment]  # core.output_formats; None: png for an image, mp4 for
    # a video (any job of a video family, or of more than one frame)
    output_quality: int = DEFAULT_OUTPUT_QUALITY  # 1..100, for jpeg and webp
    cache: CacheSetting = None  # step caching (core.step_cache): "off", a preset name or a threshold;
    # None: the engine's default (off unless the worker sets one)

    def __post_init__(self) -> None:
        if isinstance(self.reference_images, list):  # as JSON gives it: kept immutable, like every other field
            object.__setattr__(self, "reference_images", tuple(self.reference_images) or None)
        spec = self.family_spec
        from_image: list[str] = []  # the size fields the sizing image set
        image_width = image_height = 0
        sizing_field, sizing_image = self._sizing_image(spec)
        if (self.height is None or self.width is None) and is_data_uri(sizing_image):
            image_width, image_height = image_size(sizing_field, sizing_image)  # unless the job names a size
            if spec.init_image_role == "edit":  # the edit pipeline's output size for the image
                output_width, output_height = spec.edit_size(image_width, image_height)
            elif spec.reference_rules is not None:  # the reference's size as its pipeline reads it
                output_width, output_height = spec.reference_rules.scaled_size(image_width, image_height)
            else:
                output_width, output_height = image_width, image_height
            for name, value in (("width", output_width), ("height", output_height)):
                if getattr(self, name) is None:
                    if self.resize_mode in RESIZE_MODES[1:] or spec.init_image_role == "reference":
                        value -= value % spec.size_multiple  # as diffusers does: the largest multiple below
                    object.__setattr__(self, name, value)
                    from_image.append(name)
        if self.strength is None:
            only_init = self.init_image is not None and self.mask_image is None and spec.init_image_role == "start"
            object.__setattr__(self, "strength", DEFAULT_IMG2IMG_STRENGTH if only_init else 1.0)
        for name, value in spec.field_defaults().items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.output_format is None:
            is_video = spec.is_video or (isinstance(self.num_frames, int) and self.num_frames > 1)
            object.__setattr__(self, "output_format", DEFAULT_VIDEO_FORMAT if is_video else DEFAULT_IMAGE_FORMAT)
        try:
            self.validate()
        except InvalidParamsError as e:
            if e.field not in from_image:
                raise
            raise InvalidParamsError(
                sizing_field,
                f"{image_width}x{image_height}",
                f"sets the job's {e.field}, which {e.message}: name height and width, with resize_mode stretch or crop",
            ) from None
        if self.seed is None:
            object.__setattr__(self, "seed", secrets.randbelow(2**31))

    def validate(self, family: str | None = None) -> None:
        """Raise InvalidParamsError naming the first field that breaks a rule.

        `family` overrides the family known from the model name: the engine passes the
        family it loaded, for models the name does not classify (a folder, a repo id).
        """
        is_known = family is not None or (isinstance(self.model, str) and family_of_model(self.model) is not None)
        _validate(self, FAMILIES[family] if family else self.family_spec, is_known)

    def _sizing_image(self, spec: FamilySpec) -> tuple[str, object]:
        """(field, value) of the image whose size is the job's when it names none: init_image, or the listed image
        the family's pipeline sizes its output by (Flux2Pipeline: the first, QwenImageEditPlusPipeline: the last)."""
        listed = listed_images(self, spec)
        if not listed:
            return "init_image", self.init_image
        return listed[-1] if spec.init_image_role == "edit" else listed[0]

    @property
    def family_spec(self) -> FamilySpec:
        """The family the rules and defaults come from (the fallback one for unclassified models)."""
        family = family_of_model(self.model) if isinstance(self.model, str) else None
        return FAMILIES[family or FALLBACK_FAMILY]

    def for_image(self, index: int) -> GenerationParams:
        """The params of sample `index` of this job: one image, seed + index."""
        assert 0 <= index < self.num_images
        assert self.seed is not None  # drawn in __post_init__ when none is given
        if self.num_images == 1:
            return self
        return dataclasses.replace(self, seed=self.seed + index, num_images=1)

    def steps_to_run(self, family: str | None = None) -> int:
        """Denoise steps each sample runs: all of them for text-to-image, the last `strength` fraction
        (as the family's diffusers img2img pipeline rounds it) with an init image."""
        spec = FAMILIES[family] if family else self.family_spec
        if self.init_image is None or spec.init_image_role in ("edit", "reference", "first_frame"):
            return self.num_inference_steps
        return spec.steps_to_run(self.num_inference_steps, self.strength)

    def total_steps(self, family: str | None = None) -> int:
        """Denoise steps of the whole job, summed over its images: its cost (fair share, limits). Its progress
        counts `steps_to_run`, its own steps."""
        return self.steps_to_run(family) * self.num_images

    @property
    def content_type(self) -> str:
        return OUTPUT_FORMATS[self.output_format]

    def to_dict(self) -> dict[str, Any]:
        # Every field holds a scalar or a tuple (validate() checks their types), so a shallow copy is
        # dataclasses.asdict's result, without its recursive deep copy (it is on the submit path).
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationParams:
        """Build from untrusted JSON-like data; unknown fields are an error."""
        if not isinstance(data, dict):
            raise InvalidParamsError("params", data, "must be a JSON object")
        for name in data:
            if name not in _FIELD_NAMES:
                raise InvalidParamsError(name, data[name], "is not a known field")
        if "prompt" not in data:
            raise InvalidParamsError("prompt", None, "is required")
        return cls(**data)


_FIELD_NAMES = tuple(field.name for field in dataclasses.fields(GenerationParams))  # in declaration order
assert all(set(spec.model_fields) <= set(_FIELD_NAMES) for spec in FAMILIES.values())


def _validate(p: GenerationParams, spec: FamilySpec, is_known: bool = True) -> None:
    _check_str(p, "prompt", MAX_PROMPT_CHARS, allow_empty=False)
    _check_str(p, "negative_prompt", MAX_PROMPT_CHARS, allow_empty=True)
    if p.negative_prompt and spec.guidance_kind != "cfg":
        raise InvalidParamsError(
            "negative_prompt",
            p.negative_prompt,
            f"is not supported by {spec.name} models (they run no classifier-free guidance)",
        )
    for name in ("height", "width"):
        value = _check_int(p, name, MIN_SIZE, MAX_SIZE)
        if value % spec.size_multiple:
            raise InvalidParamsError(name, value, f"must be a multiple of {spec.size_multiple} for {spec.name} models")
    if p.height * p.width > MAX_PIXELS:
        raise InvalidParamsError("height", p.height, f"height*width must be at most {MAX_PIXELS}")
    _check_int(p, "num_inference_steps", max(MIN_STEPS, spec.min_steps), MAX_STEPS)
    _check_number(p, "guidance_scale", MIN_GUIDANCE, spec.max_guidance)
    if p.guidance_scale_2 is not None:
        if is_known and "guidance_scale_2" not in spec.model_fields:
            raise InvalidParamsError(
                "guidance_scale_2", p.guidance_scale_2, f"is not supported by {spec.name} models (they have one expert)"
            )
        _check_number(p, "guidance_scale_2", MIN_GUIDANCE, spec.max_guidance)
    num_images = _check_int(p, "num_images", 1, MAX_NUM_IMAGES)
    if p.seed is not None:  # image i uses seed + i: the last one must fit too
        _check_int(p, "seed", 0, MAX_SEED - (num_images - 1))
    if is_known and p.sampler not in spec.samplers:
        raise InvalidParamsError(
            "sampler", p.sampler, f"must be one of {', '.join(spec.samplers)} for {spec.name} models"
        )
    if p.sampler not in SAMPLERS:  # a folder model's job: any family's, checked against its own at submit
        raise InvalidParamsError("sampler", p.sampler, f"must be one of {', '.join(SAMPLERS)}")
    model = _check_str(p, "model", 500, allow_empty=False)
    if CONTROL_CHARACTERS.search(model):
        raise InvalidParamsError("model", model, "must not contain control characters (no model is named so)")
    _validate_frames(p, spec, is_known)
    _validate_output_format(p, spec, is_known)
    if p.lora is not None:
        _check_str(p, "lora", 200, allow_empty=False)
        if not LORA_KEY_PATTERN.fullmatch(p.lora):
            raise InvalidParamsError(
                "lora",
                p.lora,
                "must be an adapter name: letters, digits, '_', '.', '-' "
                "(at most 100, starting with a letter or digit)",
            )
    _check_number(p, "lora_scale", -MAX_LORA_SCALE, MAX_LORA_SCALE)
    check_cache(p.cache, spec.name, spec.step_cache)
    _validate_image_fields(p, spec, is_known)


def _validate_reference_images(p: GenerationParams, spec: FamilySpec, is_known: bool) -> None:
    """The list's shape, length and items; each refusal names the item, `reference_images[i]`. A model whose
    family is not known yet (a folder) may list up to the loosest family's number: its engine checks its own."""
    listed = p.reference_images
    if listed is None:
        return
    if not isinstance(listed, tuple):
        raise InvalidParamsError(REFERENCE_IMAGES, listed, "must be a list of images (data: URIs or upload ids)")
    limit = spec.max_reference_images if is_known else MAX_REFERENCE_IMAGES
    if limit == 0:
        takers = ", ".join(name for name, other in FAMILIES.items() if other.max_reference_images)
        raise InvalidParamsError(
            f"{REFERENCE_IMAGES}[0]", "<image>", f"is not supported by {spec.name} models (only {takers} take a list)"
        )
    if len(listed) > limit:
        raise InvalidParamsError(
            f"{REFERENCE_IMAGES}[{limit}]",
            f"<{len(listed)} images>",
            f"is one too many: {spec.name} models take at most {limit} reference_images",
        )
    for index, value in enumerate(listed):
        check_reference(f"{REFERENCE_IMAGES}[{index}]", value)
    if p.init_image is not None:
        raise InvalidParamsError(
            "init_image", "<image>", "cannot be given with reference_images: it is their one-image form (list it)"
        )


def _validate_image_fields(p: GenerationParams, spec: FamilySpec, is_known: bool) -> None:
    """Shapes and ranges only; decoding and sizes are checked by core.image_inputs.input_images."""
    for name in ("init_image", "mask_image"):
        if getattr(p, name) is not None:
            check_reference(name, getattr(p, name))
    _validate_reference_images(p, spec, is_known)
    if spec.init_image_role in ("edit", "reference"):
        _validate_edit_fields(p, spec)
    if spec.init_image_role == "first_frame" and p.init_image is not None and p.mask_image is not None:
        raise InvalidParamsError(
            "mask_image", "<image>", f"is not supported by {spec.name} models (init_image is the first frame)"
        )
    if spec.init_image_role == "none" and p.init_image is not None:
        raise InvalidParamsError("init_image", "<image>", f"is not supported by {spec.name} models yet")
    if p.mask_image is not None and p.init_image is None:
        raise InvalidParamsError("mask_image", "<image>", "needs an init_image")
    strength = _check_number(p, "strength", 0.0, 1.0)
    if strength == 0.0:
        raise InvalidParamsError("strength", p.strength, "must be above 0 (0 < strength <= 1)")
    if strength != 1.0 and p.init_image is None:
        raise InvalidParamsError("strength", p.strength, "needs an init_image")
    if strength != 1.0 and spec.init_image_role == "first_frame":
        raise InvalidParamsError(
            "strength", p.strength, f"must be 1 for {spec.name} models (init_image is the first frame; every step runs)"
        )
    if (
        p.init_image is not None
        and spec.init_image_role == "start"
        and spec.steps_to_run(p.num_inference_steps, strength) < 1
    ):
        raise InvalidParamsError(
            "strength", p.strength, f"runs no step of {p.num_inference_steps}: raise strength or num_inference_steps"
        )
    if p.resize_mode not in RESIZE_MODES:
        raise InvalidParamsError("resize_mode", p.resize_mode, f"must be one of {', '.join(RESIZE_MODES)}")
    _check_int(p, "output_quality", 1, 100)


def _validate_output_format(p: GenerationParams, spec: FamilySpec, is_known: bool) -> None:
    """Images for an image family, videos for a video family (and images for its one-frame jobs); a folder
    model's job any format that fits its frame count, checked against its family at submit."""
    if p.output_format not in OUTPUT_FORMATS:
        raise InvalidParamsError("output_format", p.output_format, f"must be one of {', '.join(OUTPUT_FORMATS)}")
    allowed = spec.output_formats(p.num_frames) if is_known else tuple(OUTPUT_FORMATS)
    if p.num_frames > 1:
        allowed = tuple(name for name in allowed if name in VIDEO_FORMATS)
    if p.output_format not in allowed:
        what = f"a video of {p.num_frames} frames" if p.num_frames > 1 else f"{spec.name} models (they draw images)"
        raise InvalidParamsError("output_format", p.output_format, f"must be one of {', '.join(allowed)} for {what}")


def _validate_frames(p: GenerationParams, spec: FamilySpec, is_known: bool) -> None:
    """num_frames and fps by the family's rules; a model whose family is not known yet (a folder) gets the
    loosest, and its engine checks its family's at submit."""
    num_frames = _check_int(p, "num_frames", 1, spec.max_num_frames if is_known else MAX_NUM_FRAMES)
    if is_known and (num_frames - 1) % spec.frames_per_latent:
        step = spec.frames_per_latent
        raise InvalidParamsError(
            "num_frames",
            num_frames,
            f"must be a multiple of {step} plus one (1, {step + 1}, {2 * step + 1}, ...) for {spec.name} models",
        )
    if num_frames * p.height * p.width > MAX_VIDEO_PIXELS:
        raise InvalidParamsError(
            "num_frames", num_frames, f"num_frames*height*width must be at most {MAX_VIDEO_PIXELS}"
        )
    if p.fps is not None:
        if is_known and not spec.is_video:
            raise InvalidParamsError("fps", p.fps, f"is not supported by {spec.name} models (they draw images)")
        _check_int(p, "fps", 1, MAX_FPS)


def _validate_edit_fields(p: GenerationParams, spec: FamilySpec) -> None:
    """An edit model's job edits its init_image, and a reference model's job is conditioned on it: whole, at the
    pipeline's size for it, with every step (strength does not apply: a folder model's job gets img2img's
    default before its family is known)."""
    listed = listed_images(p, spec)
    if p.init_image is None and not listed:
        if spec.init_image_role == "reference":
            return
        if spec.max_reference_images:
            raise InvalidParamsError(
                REFERENCE_IMAGES,
                None,
                f"is required by {spec.name} models: 1 to {spec.max_reference_images} images to edit "
                "(or one in init_image)",
            )
        raise InvalidParamsError("init_image", None, f"is required by {spec.name} models: the image to edit")
    what = "edit the whole image" if spec.init_image_role == "edit" else "read init_image as a reference image"
    if p.mask_image is not None:
        raise InvalidParamsError("mask_image", "<image>", f"is not supported by {spec.name} models (they {what})")
    if p.resize_mode != "none":
        raise InvalidParamsError(
            "resize_mode", p.resize_mode, f"must be none for {spec.name} models (the pipeline sizes the image itself)"
        )
    if spec.init_image_role != "edit":
        return
    for field, value in listed or [("init_image", p.init_image)]:
        if not is_data_uri(value):
            continue
        image_width, image_height = image_size(field, value)
        for area in spec.edit_areas():
            if min(spec.edit_size(image_width, image_height, area)) < MIN_EDIT_IMAGE_SIDE:
                raise InvalidParamsError(
                    field,
                    f"{image_width}x{image_height}",
                    f"is too narrow for {spec.name} models: sized to about {area} pixels, a side "
                    f"would be under {MIN_EDIT_IMAGE_SIDE}",
                )


def _check_str(p: GenerationParams, name: str, max_len: int, *, allow_empty: bool) -> str:
    value = getattr(p, name)
    if not isinstance(value, str):
        raise InvalidParamsError(name, value, "must be a string")
    if not allow_empty and not value.strip():
        raise InvalidParamsError(name, value, "must not be empty")
    if len(value) > max_len:
        raise InvalidParamsError(name, f"<{len(value)} characters>", f"must be at most {max_len} characters")
    if "\x00" in value:
        raise InvalidParamsError(name, value, "must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate: no tokenizer, JSON encoder or Redis client takes it
            raise InvalidParamsError(name, value, "must be valid Unicode text (it holds a lone surrogate)") from e
    return value


def _check_int(p: GenerationParams, name: str, low: int, high: int) -> int:
    value = getattr(p, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParamsError(name, value, "must be an integer")
    if not low <= value <= high:
        raise InvalidParamsError(name, value, f"must be between {low} and {high}")
    return value


def _check_number(p: GenerationParams, name: str, low: float, high: float) -> float:
    value = getattr(p, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParamsError(name, value, "must be a number")
    if not low <= value <= high:  # also refuses NaN
        raise InvalidParamsError(name, value, f"must be between {low} and {high}")
    return float(value)


@dataclass(frozen=True)
class CompatibilityKey:
    """What must match for two jobs to share one denoiser forward.

    Only what changes the denoiser's tensor contract or weights. Prompt, seed, step
    count, current step, guidance scale and sampler are deliberately absent, and so are
    the size and frame count for families whose denoiser mixes sizes in one forward, their rows
    packed without padding (`FamilySpec.mixes_sizes`; docs/families.md says what still splits a
    group of those: deterministic mode, a LoRA adapter in group mode). A two-expert model's expert
    is not in it either: it is chosen per step (by the step's timestep), so its adapter runs one
    forward per expert over a group's rows.
    """

    model: str
    height: int | None  # None: any size shares the forward
    width: int | None
    num_frames: int | None = 1  # None: any frame count shares the forward
    lora: str | None = None
    lora_scale: float = 1.0

    @classmethod
    def of(cls, params: GenerationParams, *, has_size: bool = True, has_lora: bool = False) -> CompatibilityKey:
        """The key of a sample; `has_size=False` for a family that mixes sizes and frame counts (the engine knows
        the family);
        `has_lora=True` keeps the adapter in the key (one adapter per group, the reference behaviour)."""
        return cls(
            model=params.model,
            height=params.height if has_size else None,
            width=params.width if has_size else None,
            num_frames=params.num_frames if has_size else None,
            lora=params.lora if has_lora else None,
            lora_scale=params.lora_scale if has_lora and params.lora else 1.0,
        )

    def __str__(self) -> str:
        lora = f" lora={self.lora}@{self.lora_scale}" if self.lora else ""
        size = f"{self.width}x{self.height}" if self.height is not None else "*x*"  # any size
        frames = self.num_frames if self.num_frames is not None else "*"
        return f"{self.model} {size}x{frames}{lora}"


# Finish-by deadlines. A job names `complete_by` (unix seconds in Python, RFC 3339 over HTTP) or
# `slo_seconds` (after its submission), not both. Unlike the start-by `deadline` (a job not started
# by then ends `expired`), a finish-by deadline never fails a job: among jobs of one priority the
# engine runs first the one with the least slack (time left minus its estimated remaining work), and
# a job that can no longer make it is reported `late`.
MAX_FINISH_BY_SECONDS = 30 * 24 * 3600  # at most 30 days ahead, like the start-by deadline


def complete_by_from(complete_by: float | None, slo_seconds: float | None, now: float) -> float | None:
    """The job's finish-by time in unix seconds, or None; raises InvalidParamsError naming the field."""
    if complete_by is not None and slo_seconds is not None:
        raise InvalidParamsError("slo_seconds", slo_seconds, "cannot be given with complete_by: give one of them")
    if slo_seconds is not None:
        if isinstance(slo_seconds, bool) or not isinstance(slo_seconds, (int, float)):
            raise InvalidParamsError("slo_seconds", slo_seconds, "must be a number of seconds")
        if not (0 < slo_seconds <= MAX_FINISH_BY_SECONDS):
            raise InvalidParamsError(
                "slo_seconds", slo_seconds, f"must be above 0 and at most {MAX_FINISH_BY_SECONDS} (30 days)"
            )
        return now + float(slo_seconds)
    if complete_by is None:
        return None
    if isinstance(complete_by, bool) or not isinstance(complete_by, (int, float)) or not math.isfinite(complete_by):
        raise InvalidParamsError("complete_by", complete_by, "must be a time (unix seconds)")
    if complete_by <= now:
        raise InvalidParamsError("complete_by", complete_by, "must be in the future")
    if complete_by > now + MAX_FINISH_BY_SECONDS:
        raise InvalidParamsError("complete_by", complete_by, "must be at most 30 days from now")
    return float(complete_by)
