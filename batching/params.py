"""Generation parameters: the one place where user input is validated.

Everything that reaches the engine, the worker or the API passes through
`GenerationParams`, so the rules below are the only rules. Each violation raises
`InvalidParamsError` naming the field and the bad value. This module imports
without torch: the API process uses it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
from dataclasses import dataclass
from typing import Any

from batching.errors import InvalidParamsError  # re-exported: the API imports it from here

SAMPLERS = ("ddim", "euler", "euler_ancestral", "dpmpp_2m")
DEFAULT_MODEL = "builtin:tiny"  # of a GenerationParams built in Python (the engine's own default model)
# The model the service serves when STEPWISE_MODEL is unset: the worker's, `stepwise up`'s and
# `stepwise generate`'s, and the model the API gives a job that names none.
DEFAULT_SERVICE_MODEL = "builtin:tiny"

MIN_SIZE = 64
MAX_SIZE = 2048
SIZE_MULTIPLE = 8
MAX_PIXELS = 2048 * 2048
MIN_STEPS = 1
MAX_STEPS = 200
MAX_PROMPT_CHARS = 2000
MIN_GUIDANCE = 0.0
MAX_GUIDANCE = 50.0
MAX_SEED = 2**63 - 1
MAX_NUM_IMAGES = 8
MAX_LORA_SCALE = 4.0


# Device names an engine accepts (EngineConfig.device, STEPWISE_DEVICE, --device).
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


def service_model() -> str:
    """STEPWISE_MODEL, else DEFAULT_SERVICE_MODEL. The worker serves it and the API defaults jobs to it,
    so a job that names no model runs on the model `stepwise up --model X` or the worker was given."""
    return os.environ.get("STEPWISE_MODEL") or DEFAULT_SERVICE_MODEL


@dataclass(frozen=True)
class GenerationParams:
    prompt: str
    negative_prompt: str = ""
    height: int = 128
    width: int = 128
    num_inference_steps: int = 20
    guidance_scale: float = 7.5  # <= 1.0 means no classifier-free guidance: one row per job
    seed: int | None = None  # None: a random seed is drawn and recorded
    sampler: str = "euler"
    num_images: int = 1  # N images become N engine jobs with seeds seed..seed+N-1
    model: str = DEFAULT_MODEL
    num_frames: int = 1
    lora: str | None = None  # adapter identity; part of the compatibility key
    lora_scale: float = 1.0

    def __post_init__(self) -> None:
        self.validate()
        if self.seed is None:
            object.__setattr__(self, "seed", secrets.randbelow(2**31))

    def validate(self) -> None:
        """Raise InvalidParamsError naming the first field that breaks a rule."""
        _validate(self)

    @property
    def has_guidance(self) -> bool:
        return self.guidance_scale > 1.0

    @property
    def num_rows(self) -> int:
        """Rows this job contributes to each denoiser forward."""
        return 2 if self.has_guidance else 1

    def for_image(self, index: int) -> GenerationParams:
        """The single-image job for image `index` of this request."""
        assert 0 <= index < self.num_images
        return dataclasses.replace(self, seed=self.seed + index, num_images=1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationParams:
        """Build from untrusted JSON-like data; unknown fields are an error."""
        if not isinstance(data, dict):
            raise InvalidParamsError("params", data, "must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        for name in data:
            if name not in known:
                raise InvalidParamsError(name, data[name], "is not a known field")
        if "prompt" not in data:
            raise InvalidParamsError("prompt", None, "is required")
        return cls(**data)


def _validate(p: GenerationParams) -> None:
    _check_str(p, "prompt", MAX_PROMPT_CHARS, allow_empty=False)
    _check_str(p, "negative_prompt", MAX_PROMPT_CHARS, allow_empty=True)
    for name in ("height", "width"):
        value = _check_int(p, name, MIN_SIZE, MAX_SIZE)
        if value % SIZE_MULTIPLE:
            raise InvalidParamsError(name, value, f"must be a multiple of {SIZE_MULTIPLE}")
    if p.height * p.width > MAX_PIXELS:
        raise InvalidParamsError("height", p.height, f"height*width must be at most {MAX_PIXELS}")
    _check_int(p, "num_inference_steps", MIN_STEPS, MAX_STEPS)
    _check_number(p, "guidance_scale", MIN_GUIDANCE, MAX_GUIDANCE)
    num_images = _check_int(p, "num_images", 1, MAX_NUM_IMAGES)
    if p.seed is not None:  # image i uses seed + i: the last one must fit too
        _check_int(p, "seed", 0, MAX_SEED - (num_images - 1))
    if p.sampler not in SAMPLERS:
        raise InvalidParamsError("sampler", p.sampler, f"must be one of {', '.join(SAMPLERS)}")
    _check_str(p, "model", 500, allow_empty=False)
    _check_int(p, "num_frames", 1, 1)
    if p.lora is not None:
        _check_str(p, "lora", 500, allow_empty=False)
    _check_number(p, "lora_scale", -MAX_LORA_SCALE, MAX_LORA_SCALE)


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
    count, current step, guidance scale and sampler are deliberately absent.
    """

    model: str
    height: int
    width: int
    num_frames: int = 1
    lora: str | None = None
    lora_scale: float = 1.0

    @classmethod
    def of(cls, params: GenerationParams) -> CompatibilityKey:
        return cls(
            model=params.model,
            height=params.height,
            width=params.width,
            num_frames=params.num_frames,
            lora=params.lora,
            lora_scale=params.lora_scale if params.lora else 1.0,
        )

    def __str__(self) -> str:
        lora = f" lora={self.lora}@{self.lora_scale}" if self.lora else ""
        return f"{self.model} {self.width}x{self.height}x{self.num_frames}{lora}"
