"""Generation parameters: the one place where user input is validated.

Everything that reaches the engine, the worker or the API passes through
`GenerationParams`, so the rules below are the only rules. Each violation raises
`InvalidParamsError` naming the field and the bad value. Torch-free: the API, storage,
the worker and the engine all read it (`from batching import GenerationParams` hands it to the engine's users).
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidParamsError
from core.families import FALLBACK_FAMILY, FAMILIES, FamilySpec, family_of_model, model_field_defaults
from core.image_inputs import RESIZE_MODES, image_size, is_data_uri, listed_images
from core.output_formats import DEFAULT_IMAGE_FORMAT, DEFAULT_VIDEO_FORMAT, OUTPUT_FORMATS
from core.param_limits import (  # noqa: F401  (core.params hands on every limit and pattern)
    CONTROL_CHARACTERS,
    DEFAULT_IMG2IMG_STRENGTH,
    DEFAULT_MODEL,
    DEFAULT_OUTPUT_QUALITY,
    DEVICE_PATTERN,
    LORA_KEY_PATTERN,
    LORA_NAME_PATTERN,
    MAX_FPS,
    MAX_GUIDANCE,
    MAX_LORA_SCALE,
    MAX_NUM_FRAMES,
    MAX_NUM_IMAGES,
    MAX_PIXELS,
    MAX_PROMPT_CHARS,
    MAX_REFERENCE_IMAGES,
    MAX_SEED,
    MAX_SIZE,
    MAX_STEPS,
    MAX_VIDEO_PIXELS,
    MIN_EDIT_IMAGE_SIDE,
    MIN_GUIDANCE,
    MIN_SIZE,
    MIN_STEPS,
    PRIORITIES,
    SAMPLERS,
    SHOWCASE_MODEL,
    SIZE_MULTIPLE,
)
from core.param_rules import validate
from core.step_cache import CacheSetting


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
        for name, value in model_field_defaults(self.model, spec).items():
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
        validate(self, FAMILIES[family] if family else self.family_spec, is_known)

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
