"""Step caching, per sample inside the continuous batch: what a job may ask for. Torch-free.

A job's `cache` field is `off`, a preset name or an explicit threshold. A sample that caches
compares, every step, a cheap early feature of its rows with the same feature at its last
full step (relative L1 over the sample's rows, so a CFG sample's two rows decide together);
under its threshold it skips the expensive part of the forward and reuses what that part
added at its last full step. Its first and last steps always compute (for some kinds its last
few: FINAL_STEPS_FRACTION), and a sample guided harder than its family's default decides
against a lower threshold (GUIDANCE_EXPONENT). The rows that compute
run the expensive part gathered into a smaller forward, so cached and uncached samples share
forwards: `cache` is not in the compatibility key.

The kind of cache is the family's (`FamilySpec.step_cache`), implemented by its adapter on one
shared mechanism (`batching.pipelines.step_cache_rows.cached_blocks`):
- "first_block" (FLUX.1, FLUX.2 and klein, SD3, Qwen-Image and its editors: First-Block
  Cache): the early feature is the residual the first transformer block adds to the image
  tokens; a skip reuses the residual of the other blocks.
- "modulated_input" (Z-Image, Wan: TeaCache's feature): the early feature is the first main
  block's timestep-modulated input; a skip reuses the residual of every main block (Wan 2.2:
  of its expert's; a sample's first step on its second expert computes).
- "deep" (the UNet families, DeepCache): the early feature is the first down block's output;
  a skip reuses the input the last up block took from the deep path, and computes only the
  shallow path (conv_in, the first down block, the last up block).

Presets are per kind, since the two features change at different rates
(benchmarks/step_cache.py measured them; docs/benchmarks.md gives the figures).
"""

from __future__ import annotations

import math

from core.errors import InvalidParamsError

CACHE_OFF = "off"
STEP_CACHE_KINDS = ("first_block", "modulated_input", "deep")
# kind -> preset -> relative-L1 threshold of the early feature since the sample's last full step
PRESETS: dict[str, dict[str, float]] = {
    "first_block": {"balanced": 0.1, "fast": 0.2},
    "modulated_input": {"balanced": 0.1, "fast": 0.17},
    "deep": {"balanced": 0.1, "fast": 0.2},
}
PRESET_NAMES = tuple(dict.fromkeys(name for presets in PRESETS.values() for name in presets))
# kind -> share of a sample's steps, at its end, that always compute (beyond its last step, which always does):
# edges and corners settle there, and a skip there shows (Z-Image, builtin:shapes-dit: measured)
FINAL_STEPS_FRACTION: dict[str, float] = {"first_block": 0.0, "modulated_input": 0.2, "deep": 0.0}
# kind -> how fast a sample's threshold falls with classifier-free guidance above its family's default: at scale g
# it is the setting's times (default / g) ** exponent. A reused residual's error reaches the guided prediction
# multiplied by the guidance, and strongly guided trajectories fork sooner (Z-Image, builtin:shapes-dit: measured).
# The others are as first measured: DeepCache kept every builtin:shapes case at guidance 10; FLUX.1 has no CFG rows
# (SD3, Qwen-Image and klein do: no trained model of theirs here to measure a rule on).
GUIDANCE_EXPONENT: dict[str, float] = {"first_block": 0.0, "modulated_input": 2.0, "deep": 0.0}
MAX_THRESHOLD = 1.0  # a feature that changed by more than its own size is not "unchanged"

CacheSetting = str | float | None  # GenerationParams.cache: off, a preset name, a threshold; None: the engine's default


def check_cache(value: CacheSetting, family: str, kind: str | None, *, field: str = "cache") -> None:
    """Raise InvalidParamsError naming `field` unless `value` is a cache setting `family` serves."""
    if value is None or value == CACHE_OFF:
        return
    if isinstance(value, str):
        if value not in PRESET_NAMES:
            raise InvalidParamsError(
                field, value, f"must be {CACHE_OFF}, one of {', '.join(PRESET_NAMES)}, or a threshold number"
            )
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParamsError(field, value, f"must be {CACHE_OFF}, a preset name or a threshold number")
    elif not (0 < value <= MAX_THRESHOLD) or not math.isfinite(value):
        raise InvalidParamsError(field, value, f"must be a threshold above 0 and at most {MAX_THRESHOLD:g}")
    if kind is None:
        raise InvalidParamsError(field, value, f"is not supported by {family} models yet (only {CACHE_OFF})")


def cache_setting(text: str) -> CacheSetting:
    """A setting written as text (STEPWISE_STEP_CACHE, `--cache`): a threshold when it is a number."""
    try:
        return float(text)
    except ValueError:
        return text


def sample_threshold(
    value: CacheSetting, kind: str | None, guidance_scale: float, default_guidance: float, has_guidance_rows: bool
) -> float | None:
    """A sample's own threshold: its setting's (`cache_threshold`), lower where it is guided harder than its
    family's default (`GUIDANCE_EXPONENT`); None: the sample does not cache."""
    threshold = cache_threshold(value, kind)
    if threshold is None or kind is None or not has_guidance_rows or not 0 < default_guidance < guidance_scale:
        return threshold
    return threshold * (default_guidance / guidance_scale) ** GUIDANCE_EXPONENT[kind]


def num_final_steps(kind: str, num_steps: int) -> int:
    """How many of a sample's last steps always compute: at least the last one."""
    return max(1, round(FINAL_STEPS_FRACTION[kind] * num_steps))


def cache_threshold(value: CacheSetting, kind: str | None) -> float | None:
    """The threshold of a valid setting for a family whose cache is `kind`; None: the sample does not cache."""
    if value is None or value == CACHE_OFF or kind is None:
        return None
    if isinstance(value, str):
        return PRESETS[kind][value]
    return float(value)
