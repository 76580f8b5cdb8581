"""Factories and checks for engine tests on the built-in tiny models (CPU): params, pixel differences,
diffusers' own pipelines as references, and ways of submitting jobs alone, together or staggered."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from batching import DiffusionEngine, EngineConfig, GenerationParams
from batching.job import GenerationResult

DEADLINE_SECONDS = 60  # the longest a test waits for something the engine does in well under a second


@contextlib.contextmanager
def engines_by_model(max_num_seqs: int) -> Iterator[Callable[[str], DiffusionEngine]]:
    """model -> its CPU engine of `max_num_seqs`, started on first use; every one shut down on leaving."""
    started: dict[str, DiffusionEngine] = {}

    def engine_for(model: str) -> DiffusionEngine:
        if model not in started:
            started[model] = DiffusionEngine(EngineConfig(model=model, device="cpu", max_num_seqs=max_num_seqs))
        return started[model]

    try:
        yield engine_for
    finally:
        for engine in started.values():
            engine.shutdown(abort=True)


def make_params(**overrides) -> GenerationParams:
    values = dict(
        prompt="a red fox in the forest", seed=7, num_inference_steps=8, guidance_scale=7.5, height=64, width=64
    )
    values.update(overrides)
    return GenerationParams(**values)


def mixed_params() -> list[GenerationParams]:
    """Eight jobs that differ in everything a group may mix: steps, guidance, negative prompt, sampler."""
    return [
        make_params(prompt="a red fox", seed=1, sampler="euler", num_inference_steps=12),
        make_params(prompt="a blue bird", seed=2, sampler="ddim", num_inference_steps=6, guidance_scale=1.0),
        make_params(
            prompt="an old castle", seed=3, sampler="euler_ancestral", num_inference_steps=10, negative_prompt="blurry"
        ),
        make_params(prompt="a calm lake", seed=4, sampler="dpmpp_2m", num_inference_steps=9, guidance_scale=3.0),
        make_params(prompt="a city at night", seed=5, sampler="euler", num_inference_steps=5, guidance_scale=0.0),
        make_params(prompt="snow", seed=6, sampler="ddim", num_inference_steps=11, negative_prompt="dark, low quality"),
        make_params(prompt="a cute dog", seed=7, sampler="euler_ancestral", num_inference_steps=7, guidance_scale=1.0),
        make_params(
            prompt="a tiger",
            seed=8,
            sampler="dpmpp_2m",
            num_inference_steps=8,
            guidance_scale=12.0,
            negative_prompt="cat",
        ),
    ]


def pixels(image) -> np.ndarray:
    return np.asarray(image).astype(np.int16)


def max_pixel_diff(image_a, image_b) -> int:
    return int(np.abs(pixels(image_a) - pixels(image_b)).max())


def own_pipeline(model: str, pipeline_class: str):
    """diffusers' own `pipeline_class` (a name in `diffusers`) loaded from a built-in model's folder, quiet."""
    import diffusers

    from batching.builtin_model import builtin_model_path

    pipeline = getattr(diffusers, pipeline_class).from_pretrained(builtin_model_path(model), local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def own_pipeline_image(pipeline, params: GenerationParams, guidance_name: str = "guidance_scale", **inputs):
    """What diffusers' `pipeline` draws for `params`: its prompt (and negative prompt, when it has one), size,
    steps, guidance (the pipeline's argument `guidance_name`) and seed, plus `inputs`."""
    if params.negative_prompt:
        inputs["negative_prompt"] = params.negative_prompt
    return pipeline(
        prompt=params.prompt,  # by name: Flux2Pipeline's first argument is its reference image
        height=params.height,
        width=params.width,
        num_inference_steps=params.num_inference_steps,
        generator=torch.Generator("cpu").manual_seed(params.seed),
        **{guidance_name: params.guidance_scale},
        **inputs,
    ).images[0]


def run_alone(engine: DiffusionEngine, params_list: list[GenerationParams]) -> list:
    """Each job on its own: submitted only after the previous one finished."""
    return [engine.submit(params).result(timeout=120).image for params in params_list]


def assert_together_equals_alone(engine: DiffusionEngine, params_list: list[GenerationParams]) -> list:
    """Each job alone, then all submitted at once: each image equals itself alone, and some forward held all
    of the jobs (they shared it). The images made together."""
    alone = run_alone(engine, params_list)
    num_jobs = len(params_list)
    forwards_of_all_before = engine.stats()["jobs_per_forward"].get(num_jobs, 0)

    futures = [engine.submit(params) for params in params_list]  # admitted together: they share forwards
    together = [future.result(timeout=120).image for future in futures]

    for image_alone, image_together in zip(alone, together):
        assert max_pixel_diff(image_alone, image_together) <= 1
    assert engine.stats()["jobs_per_forward"].get(num_jobs, 0) > forwards_of_all_before, "all jobs shared a forward"
    return together


def num_shared_forwards(engine: DiffusionEngine) -> int:
    """Forwards so far that carried more than one sample."""
    return sum(count for num_samples, count in engine.stats()["jobs_per_forward"].items() if num_samples > 1)


def steps_taken_meanwhile(steps: list, more: int = 3) -> int:
    """Waits until `steps` (appended to by a job's on_progress) holds `more` more entries, or DEADLINE_SECONDS
    pass: how many it gained meanwhile."""
    before = len(steps)
    deadline = time.monotonic() + DEADLINE_SECONDS
    while len(steps) < before + more and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(steps) - before


def run_staggered(
    engine: DiffusionEngine, params_list: list[GenerationParams], *, steps_between_joins: int = 1
) -> list:
    """The first job starts; job i joins when the first has taken i * steps_between_joins steps. The images."""
    return [result.image for result in staggered_results(engine, params_list, steps_between_joins=steps_between_joins)]


def staggered_results(
    engine: DiffusionEngine, params_list: list[GenerationParams], *, steps_between_joins: int = 1
) -> list[GenerationResult]:
    """As `run_staggered`: the jobs' whole results (a video's frames too)."""
    futures = {}
    join_at_step = {i * steps_between_joins: i for i in range(1, len(params_list))}

    def submit_next(num_steps_done: int, num_steps_total: int) -> None:
        index = join_at_step.get(num_steps_done)
        if index is not None:
            futures[index] = engine.submit(params_list[index])

    first = params_list[0]
    assert first.num_inference_steps > (len(params_list) - 1) * steps_between_joins
    futures[0] = engine.submit(first, on_progress=submit_next)
    futures[0].result(timeout=120)
    return [futures[i].result(timeout=120) for i in range(len(params_list))]
