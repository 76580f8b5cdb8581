"""Per-model cost limits, checked at submit so that one job cannot hold a worker for minutes.

A job's cost is its pixel-steps, `num_images x num_frames x height x width x steps run`: the denoiser's
work grows with each factor (a video's frames too), so this one number bounds how long a job keeps the engine. The
steps run are `num_inference_steps`, or with an init image the last `strength` fraction of
them (what the engine runs and progress counts: `GenerationParams.total_steps`). Each model
has two limits, `max_pixels` (of one image) and `max_pixel_steps` (of the whole job). The
engine's own hard limits (`core.params`) still apply on top.

Defaults are sized for the device: a CPU (STEPWISE_DEVICE=cpu, or `auto` with a built-in model)
gets limits under which the built-in models finish a job in seconds; a GPU gets limits that let
a real checkpoint draw 8 images of 1024x1024 at 50 steps. The operator overrides them for every
model (STEPWISE_MAX_PIXELS, STEPWISE_MAX_PIXEL_STEPS) and per model (STEPWISE_MODEL_LIMITS, a
JSON object `{"<model>": {"max_pixels": N, "max_pixel_steps": N}}`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import core.params as P
from api.errors import ApiError
from core.builtin_models import is_builtin
from settings import SettingsError, default

LIMIT_NAMES = ("max_pixels", "max_pixel_steps")


@dataclass(frozen=True)
class ModelLimits:
    max_pixels: int  # height x width of one image
    max_pixel_steps: int  # num_images x num_frames x height x width x steps run, of one job


CPU_LIMITS = ModelLimits(max_pixels=512 * 512, max_pixel_steps=8 * 256 * 256 * 50)
GPU_LIMITS = ModelLimits(max_pixels=P.MAX_PIXELS, max_pixel_steps=8 * 1024 * 1024 * 50)


class LimitsError(SettingsError):
    """A limit setting is malformed; the message names the variable."""


def pixel_steps(params: P.GenerationParams) -> int:
    return params.num_frames * params.height * params.width * params.total_steps()  # total_steps: images x steps


@dataclass(frozen=True)
class LimitTable:
    device: str = "auto"  # STEPWISE_DEVICE: decides which defaults apply
    overrides: ModelLimits | None = None  # STEPWISE_MAX_PIXELS / STEPWISE_MAX_PIXEL_STEPS, for every model
    per_model: dict[str, dict[str, int]] = field(default_factory=dict)  # STEPWISE_MODEL_LIMITS

    def for_model(self, model: str) -> ModelLimits:
        is_cpu = self.device == "cpu" or (self.device == "auto" and is_builtin(model))
        limits = self.overrides or (CPU_LIMITS if is_cpu else GPU_LIMITS)
        return replace(limits, **self.per_model.get(model, {}))

    def advertised(self, model: str) -> dict[str, int]:
        """The limits `check` enforces for `model`, as GET /v1/models lists them (the engine's own pixel limit
        folded in: an operator's override cannot raise it)."""
        limits = self.for_model(model)
        return {"max_pixels": min(limits.max_pixels, P.MAX_PIXELS), "max_pixel_steps": limits.max_pixel_steps}

    def check(self, params: P.GenerationParams, field_prefix: str = "") -> None:
        """Raise a 422 naming the field to lower, or return when the job fits its model's limits."""
        limits = self.for_model(params.model)
        pixels = params.height * params.width
        if pixels > limits.max_pixels:
            raise _over(
                f"{field_prefix}height",
                f"height x width = {pixels} is over the limit of {limits.max_pixels} pixels "
                f"for model {params.model} (STEPWISE_MAX_PIXELS / STEPWISE_MODEL_LIMITS)",
            )
        cost = pixel_steps(params)
        if cost > limits.max_pixel_steps:
            field_name = "num_images" if params.num_images > 1 else "num_inference_steps"
            if params.num_frames > 1:
                field_name = "num_frames"
            raise _over(
                f"{field_prefix}{field_name}",
                f"num_images x num_frames x height x width x steps run (num_inference_steps, times strength with "
                f"an init_image) = {cost} is over the limit of {limits.max_pixel_steps} for model {params.model}: "
                f"ask for fewer images, frames, steps or pixels (STEPWISE_MAX_PIXEL_STEPS / STEPWISE_MODEL_LIMITS)",
            )

    @classmethod
    def configured(
        cls, *, device: str, max_pixels: int | None, max_pixel_steps: int | None, model_limits: str
    ) -> LimitTable:
        """The table from its settings (api.settings reads them): STEPWISE_DEVICE, STEPWISE_MAX_PIXELS,
        STEPWISE_MAX_PIXEL_STEPS (None: the device's defaults) and STEPWISE_MODEL_LIMITS (JSON text)."""
        table = cls(device=device, per_model=_per_model(model_limits))
        if max_pixels is None and max_pixel_steps is None:
            return table
        base = table.for_model(default("STEPWISE_MODEL"))
        overrides = ModelLimits(
            max_pixels=max_pixels or base.max_pixels, max_pixel_steps=max_pixel_steps or base.max_pixel_steps
        )
        return replace(table, overrides=overrides)


def _over(field_name: str, message: str) -> ApiError:
    return ApiError(422, "limit_exceeded", f"{field_name}: {message}", field=field_name)


def _positive_int(name: str, raw: Any) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if isinstance(raw, bool) or value < 1:
        raise LimitsError(f"{name} must be a positive integer (got {raw!r})")
    return value


def _per_model(text: str) -> dict[str, dict[str, int]]:
    name = "STEPWISE_MODEL_LIMITS"
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        raise LimitsError(
            f'{name} must be a JSON object such as {{"builtin:small": {{"max_pixels": 65536}}}} ({e})'
        ) from e
    if not isinstance(data, dict):
        raise LimitsError(f"{name} must be a JSON object mapping model names to limits")
    table = {}
    for model, limits in data.items():
        if not isinstance(limits, dict) or not set(limits) <= set(LIMIT_NAMES):
            raise LimitsError(f"{name}: the limits of {model!r} must be an object with keys from {LIMIT_NAMES}")
        checked = {key: _positive_int(f"{name}[{model!r}].{key}", value) for key, value in limits.items()}
        table[model] = {key: value for key, value in checked.items() if value is not None}  # null: the default
    return table
