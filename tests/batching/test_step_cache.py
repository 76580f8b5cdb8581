"""Step caching per sample inside the continuous batch (core.step_cache).

A cached job's skip decisions are its own: co-batched (staggered joins, cached and uncached
neighbours, other sizes) it decides and draws as it does alone, except where a decision sits
within float noise of its threshold; the tests record every decision to show how often that
happens. Each cached job gets its own threshold here, so that its decisions can be told apart.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import batching.pipelines.step_cache_rows as step_cache_rows
from batching import DiffusionEngine, EngineConfig, GenerationParams
from core.errors import InvalidParamsError
from core.families import FAMILIES
from core.step_cache import STEP_CACHE_KINDS, check_cache, num_final_steps, sample_threshold
from tests.support.engines import engines_by_model, max_pixel_diff, pixels, run_alone, run_staggered

NEAR_THRESHOLD = 1e-4  # a relative change this close to its threshold may fall either side with the batch size


@pytest.fixture
def decisions(monkeypatch):
    """threshold -> the relative changes its sample's decisions saw, in step order."""
    seen: dict[float, list[float]] = {}
    decide_from = step_cache_rows.relative_changes

    def recording(samples, features):
        changes = decide_from(samples, features)
        for sample, change in zip(samples, changes):
            if change is not None:
                seen.setdefault(sample.state.threshold, []).append(change)
        return changes

    monkeypatch.setattr(step_cache_rows, "relative_changes", recording)
    return seen


@pytest.fixture(scope="module")
def engines():
    """model -> its engine (8 jobs at once), started on first use and shut down with the module."""
    with engines_by_model(max_num_seqs=8) as engine_for:
        yield engine_for


@pytest.fixture(scope="module")
def zimage_engine(engines):
    return engines("builtin:tiny-zimage")


def transformer_jobs(model: str, num_jobs: int, **fields) -> list[GenerationParams]:
    """Cached jobs (each its own threshold) between uncached ones, of three sizes (mixed in a forward), with and
    without guidance (CFG rows where the family runs them, or its embedded guidance)."""
    sizes = (64, 96, 80)
    return [
        GenerationParams(
            prompt=f"a shape number {index}",
            model=model,
            seed=index,
            num_inference_steps=num_jobs + 6,
            height=sizes[index % 3],
            width=sizes[(index + 1) % 3],
            guidance_scale=0.0 if index % 4 == 3 else 4.0 + index % 2,
            cache="off" if index % 3 == 1 else 1.0 - index / 1000,
            **fields,
        )
        for index in range(num_jobs)
    ]


def unet_jobs(model: str, num_jobs: int) -> list[GenerationParams]:
    """As transformer_jobs on a UNet family, one size, the samplers mixed: DeepCache's deep path gathered with the
    computing rows (SDXL's added conditioning, pooled text and time ids, too)."""
    return [
        GenerationParams(
            prompt=f"a fox number {index}",
            model=model,
            seed=index,
            num_inference_steps=num_jobs + 6,
            height=64,
            width=64,
            guidance_scale=1.0 if index % 4 == 3 else 7.5,
            sampler=("euler", "ddim", "dpmpp_2m")[index % 3],
            cache="off" if index % 3 == 1 else 1.0 - index / 1000,
        )
        for index in range(num_jobs)
    ]


def skip_pattern(changes: list[float], threshold: float) -> list[bool]:
    return [change < threshold for change in changes]


def near_threshold(changes: list[float], threshold: float) -> int:
    return sum(abs(change - threshold) < NEAR_THRESHOLD for change in changes)


# Every family's step cache, on its tiny built-in: model -> its jobs. Qwen-Image runs CFG only with a negative
# prompt; the Wan jobs are short videos, Wan 2.2's steps split between its two experts.
FAMILY_JOBS = {
    "builtin:tiny-zimage": functools.partial(transformer_jobs, "builtin:tiny-zimage"),
    "builtin:tiny-flux": functools.partial(transformer_jobs, "builtin:tiny-flux"),
    "builtin:tiny": functools.partial(unet_jobs, "builtin:tiny"),
    "builtin:tiny-sdxl": functools.partial(unet_jobs, "builtin:tiny-sdxl"),
    "builtin:tiny-sd3": functools.partial(transformer_jobs, "builtin:tiny-sd3"),
    "builtin:tiny-flux2": functools.partial(transformer_jobs, "builtin:tiny-flux2"),
    "builtin:tiny-flux2-klein": functools.partial(transformer_jobs, "builtin:tiny-flux2-klein"),
    "builtin:tiny-qwen-image": functools.partial(transformer_jobs, "builtin:tiny-qwen-image", negative_prompt="dull"),
    "builtin:tiny-wan": functools.partial(transformer_jobs, "builtin:tiny-wan", num_frames=5),
    "builtin:tiny-wan22": functools.partial(transformer_jobs, "builtin:tiny-wan22", num_frames=5),
}


@pytest.mark.parametrize("model", FAMILY_JOBS)
def test_a_cached_job_co_batched_decides_and_draws_as_it_does_alone(engines, decisions, model):
    engine = engines(model)
    params_list = FAMILY_JOBS[model](8)
    alone = run_alone(engine, params_list)
    decisions_alone = {threshold: list(changes) for threshold, changes in decisions.items()}
    decisions.clear()
    skipped_before = engine.stats()["step_cache"][engine.family]["steps_skipped"]

    batched = run_staggered(engine, params_list)

    num_decisions = num_near = 0
    for params, image_alone, image_batched in zip(params_list, alone, batched):
        if params.cache == "off":
            assert max_pixel_diff(image_alone, image_batched) <= 1, "an uncached job changed beside cached ones"
            continue
        threshold = params.cache
        changes_alone, changes_batched = decisions_alone[threshold], decisions[threshold]
        num_decisions += len(changes_alone)
        num_near += near_threshold(changes_alone, threshold)
        if near_threshold(changes_alone, threshold) or near_threshold(changes_batched, threshold):
            continue  # may decide otherwise batched: counted, not compared
        assert skip_pattern(changes_batched, threshold) == skip_pattern(changes_alone, threshold)
        assert np.allclose(changes_batched, changes_alone, rtol=1e-3, atol=1e-6)
        assert max_pixel_diff(image_alone, image_batched) <= 1, f"cached job {threshold} differs batched"
    assert engine.stats()["step_cache"][engine.family]["steps_skipped"] > skipped_before, "cached jobs skipped"
    assert num_decisions >= 5 * len([params for params in params_list if params.cache != "off"])
    assert num_near <= num_decisions // 20, f"{num_near} of {num_decisions} decisions within float noise"


def test_over_many_jobs_decisions_near_the_threshold_are_rare_and_the_only_ones_that_differ(zimage_engine, decisions):
    params_list = [
        GenerationParams(
            prompt=f"job {index}",
            model="builtin:tiny-zimage",
            seed=100 + index,
            num_inference_steps=6,
            height=64,
            width=64 + 16 * (index % 3),
            cache=0.39 - index / 1000,  # about the median of this model's changes: many decisions either way
        )
        for index in range(24)
    ]
    run_alone(zimage_engine, params_list)
    decisions_alone = {threshold: list(changes) for threshold, changes in decisions.items()}
    decisions.clear()

    futures = [zimage_engine.submit(params) for params in params_list]  # 8 at a time, joining as others leave
    [future.result(timeout=120) for future in futures]

    num_decisions = num_near = num_different = 0
    for params in params_list:
        threshold = params.cache
        changes_alone, changes_batched = decisions_alone[threshold], decisions[threshold]
        num_decisions += len(changes_alone)
        num_near += near_threshold(changes_alone, threshold)
        if skip_pattern(changes_alone, threshold) != skip_pattern(changes_batched, threshold):
            num_different += 1
            assert near_threshold(changes_alone, threshold), f"job {threshold} decided otherwise, far from it"
    skipped = sum(sum(skip_pattern(changes, threshold)) for threshold, changes in decisions_alone.items())
    assert 0 < skipped < num_decisions, "the threshold splits the decisions"
    assert num_different <= num_near <= num_decisions // 20, f"{num_near} of {num_decisions} near the threshold"


# Each family's fields for a short job (Qwen-Image runs CFG only with a negative prompt; Wan 2.2: each expert on
# every row in deterministic mode).
DETERMINISTIC_FIELDS = {
    "builtin:tiny-zimage": {},
    "builtin:tiny-flux": {},
    "builtin:tiny": {},
    "builtin:tiny-sd3": {},
    "builtin:tiny-flux2": {},
    "builtin:tiny-qwen-image": {"negative_prompt": "dull"},
    "builtin:tiny-wan": {"num_frames": 5},
    "builtin:tiny-wan22": {"num_frames": 5},
}


@pytest.mark.parametrize(("model", "fields"), DETERMINISTIC_FIELDS.items())
def test_deterministic_mode_keeps_cached_and_uncached_jobs_bit_identical_alone_and_batched(model, fields):
    """Cached and uncached jobs share forwards; each, cached or not, draws the same bits as alone (an uncached job
    alone runs beside no cached one: its forwards must not change kernels when one joins)."""
    engine = DiffusionEngine(EngineConfig(model=model, device="cpu", max_num_seqs=4, deterministic=True))
    try:
        params_list = [
            GenerationParams(
                prompt=f"a shape {index}",
                model=model,
                seed=index,
                num_inference_steps=8,
                height=64,
                width=64,
                cache="off" if index == 1 else 1.0,
                **fields,
            )
            for index in range(4)
        ]
        alone = run_alone(engine, params_list)

        batched = run_staggered(engine, params_list, steps_between_joins=2)

        for image_alone, image_batched in zip(alone, batched):
            assert (pixels(image_alone) == pixels(image_batched)).all()
        assert engine.stats()["step_cache"][engine.family]["steps_skipped"] > 0
    finally:
        engine.shutdown(abort=True)


def psnr(image_a, image_b) -> float:
    error = ((pixels(image_a).astype(np.float64) - pixels(image_b)) ** 2).mean()
    return float(10 * np.log10(255**2 / max(error, 1e-10)))


def test_a_cached_job_on_a_trained_model_skips_blocks_and_stays_close_to_uncached():
    engine = DiffusionEngine(EngineConfig(model="builtin:shapes", device="cpu", max_num_seqs=4))
    try:
        prompts = ["a red circle on a blue background", "a yellow square on a black background"]
        params = [
            GenerationParams(prompt=prompt, model="builtin:shapes", seed=3, height=96, width=96) for prompt in prompts
        ]
        uncached = [future.result(timeout=120).image for future in [engine.submit(p) for p in params]]
        stats_before = engine.stats()["step_cache"]["sd"]

        futures = [engine.submit(GenerationParams(**{**p.to_dict(), "cache": "fast"})) for p in params]
        cached = [future.result(timeout=120).image for future in futures]

        stats = engine.stats()["step_cache"]["sd"]
        num_blocks = stats["blocks"] - stats_before["blocks"]
        num_skipped = stats["blocks_skipped"] - stats_before["blocks_skipped"]
        assert num_skipped >= num_blocks // 5, f"skipped {num_skipped} of {num_blocks} block evaluations"
        assert 0 < stats["skipped_fraction"] < 1
        for image_uncached, image_cached in zip(uncached, cached):
            assert psnr(image_uncached, image_cached) >= 25
    finally:
        engine.shutdown(abort=True)


@pytest.mark.parametrize("cache", ["fastest", "", 0, -1, 1.5, float("nan"), True, [0.1]])
def test_an_invalid_cache_value_is_refused_naming_the_field(cache):
    with pytest.raises(InvalidParamsError) as error:
        GenerationParams(prompt="a fox", model="builtin:tiny-zimage", cache=cache)

    assert error.value.field == "cache"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_takes_a_cache_setting(family):
    spec = FAMILIES[family]

    assert spec.step_cache in STEP_CACHE_KINDS, f"{family} has no step cache"
    for cache in ("off", "balanced", "fast", 0.3):
        check_cache(cache, family, spec.step_cache)


def test_a_cache_for_a_family_without_a_step_cache_is_refused_naming_the_field():
    with pytest.raises(InvalidParamsError) as error:
        check_cache("fast", "new", None)

    assert error.value.field == "cache"
    check_cache("off", "new", None)


def test_a_cached_z_image_job_computes_its_first_step_and_its_last_fifth(zimage_engine, decisions):
    params = GenerationParams(
        prompt="a shape", model="builtin:tiny-zimage", seed=1, num_inference_steps=10, height=64, width=64, cache=0.9
    )
    steps_skipped_before = zimage_engine.stats()["step_cache"]["zimage"]["steps_skipped"]

    zimage_engine.submit(params).result(timeout=120)

    # step 0 has no full step to compare with; steps 8 and 9 (the last 20%) always compute: 7 decisions
    assert len(decisions[0.9]) == 10 - 1 - num_final_steps("modulated_input", 10) == 7
    steps_skipped = zimage_engine.stats()["step_cache"]["zimage"]["steps_skipped"] - steps_skipped_before
    assert steps_skipped == sum(change < 0.9 for change in decisions[0.9]) > 0


def test_a_two_expert_wan_job_computes_the_first_step_of_each_expert(engines, decisions):
    def num_decisions(model: str, threshold: float) -> int:
        params = GenerationParams(prompt="a shape", model=model, seed=1, num_inference_steps=10, height=64, width=64,
                                  num_frames=5, guidance_scale=1.0, cache=threshold)  # fmt: skip
        engines(model).submit(params).result(timeout=120)
        return len(decisions[threshold])

    # step 0 has no full step to compare with; steps 8 and 9 (the last fifth) always compute
    assert num_decisions("builtin:tiny-wan", 0.99) == 10 - 1 - 2
    # and the low-noise expert's first step: a cache is its expert's
    assert num_decisions("builtin:tiny-wan22", 0.98) == 10 - 1 - 2 - 1


@pytest.mark.parametrize(
    ("guidance_scale", "has_guidance_rows", "kind", "expected"),
    [
        (5.0, True, "modulated_input", 0.2),  # the family's default guidance: the setting's threshold
        (2.0, True, "modulated_input", 0.2),  # below it: not raised
        (10.0, True, "modulated_input", 0.05),  # twice the default: a quarter
        (10.0, False, "modulated_input", 0.2),  # no CFG rows (the scale is embedded or unused)
        (10.0, True, "deep", 0.2),  # DeepCache kept every builtin:shapes case at guidance 10 without it
    ],
)
def test_a_sample_guided_harder_than_its_family_default_decides_against_a_lower_threshold(
    guidance_scale, has_guidance_rows, kind, expected
):
    threshold = sample_threshold(0.2, kind, guidance_scale, 5.0, has_guidance_rows)

    assert threshold == pytest.approx(expected)
    assert sample_threshold("off", kind, guidance_scale, 5.0, has_guidance_rows) is None


def test_a_strongly_guided_cached_job_skips_fewer_steps_than_the_same_job_guided_at_the_default(zimage_engine):
    def steps_skipped(guidance_scale: float) -> int:
        before = zimage_engine.stats()["step_cache"]["zimage"]["steps_skipped"]
        params = GenerationParams(prompt="a shape", model="builtin:tiny-zimage", seed=2, num_inference_steps=12,
                                  height=64, width=64, guidance_scale=guidance_scale, cache=0.3)  # fmt: skip
        zimage_engine.submit(params).result(timeout=120)
        return zimage_engine.stats()["step_cache"]["zimage"]["steps_skipped"] - before

    assert steps_skipped(10.0) < steps_skipped(5.0)
