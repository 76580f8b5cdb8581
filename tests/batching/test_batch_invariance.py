"""A job's image must not depend on what it was batched with."""

from __future__ import annotations

import pytest

from tests.support.engines import (
    make_params,
    max_pixel_diff,
    mixed_params,
    num_shared_forwards,
    own_pipeline,
    own_pipeline_image,
    pixels,
    run_alone,
    run_staggered,
)


def test_co_batched_jobs_match_the_same_jobs_alone_within_one_level(solo_engine, batched_engine):
    params_list = mixed_params()
    alone = run_alone(solo_engine, params_list)
    assert len({pixels(image).tobytes() for image in alone}) == len(params_list)
    forwards_before = dict(batched_engine.stats()["jobs_per_forward"])

    batched = run_staggered(batched_engine, params_list)

    for params, image_alone, image_batched in zip(params_list, alone, batched):
        assert max_pixel_diff(image_alone, image_batched) <= 1, f"{params.sampler} job differs from its solo run"
    jobs_per_forward = batched_engine.stats()["jobs_per_forward"]
    assert any(jobs_per_forward.get(n, 0) > forwards_before.get(n, 0) for n in range(5, 9))


def test_deterministic_mode_is_bit_identical_alone_and_batched(deterministic_engine):
    params_list = mixed_params()[:4]
    alone = run_alone(deterministic_engine, params_list)
    shared_before = num_shared_forwards(deterministic_engine)

    batched = run_staggered(deterministic_engine, params_list, steps_between_joins=2)

    assert num_shared_forwards(deterministic_engine) > shared_before, "the jobs shared forwards"
    for image_alone, image_batched in zip(alone, batched):
        assert (pixels(image_alone) == pixels(image_batched)).all()


@pytest.mark.parametrize("sampler", ["ddim", "euler", "euler_ancestral", "dpmpp_2m"])
def test_a_job_matches_diffusers_own_pipeline_for_the_same_seed(batched_engine, sampler):
    from batching.samplers import SAMPLER_CLASSES

    params = make_params(sampler=sampler, negative_prompt="blurry")
    pipeline = own_pipeline("builtin:tiny", "StableDiffusionPipeline")
    sampler_class, overrides = SAMPLER_CLASSES[sampler]
    pipeline.scheduler = sampler_class.from_config(pipeline.scheduler.config, **overrides)
    expected = own_pipeline_image(pipeline, params)

    image = batched_engine.submit(params).result(timeout=120).image

    assert max_pixel_diff(image, expected) <= 1
