"""FLUX.2 in the engine (builtin:tiny-flux2): mixed sizes, steps, guidance and reference images in one forward.

The guarantees every family has run for FLUX.2 in tests/batching/test_families.py; here
what is FLUX.2's own: a job's init_image is a reference image whose tokens join the
sequence, so one forward carries rows of different sizes with and without references,
and each job still equals itself alone (bit for bit in deterministic mode) and diffusers'
own `Flux2Pipeline` given the same image.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from batching import DiffusionEngine, EngineConfig, GenerationParams, InvalidParamsError
from tests.support.engines import max_pixel_diff, own_pipeline, own_pipeline_image, pixels, run_alone, run_staggered
from tests.support.pictures import init_picture, png_data_uri

MODEL = "builtin:tiny-flux2"


def reference_picture(width: int = 80, height: int = 72) -> Image.Image:
    """Not a multiple of 16 in height: the pipeline center-crops it to 80x64."""
    return init_picture(max(width, height)).resize((width, height))


def flux2_params(**overrides) -> GenerationParams:
    values = dict(prompt="a red fox", model=MODEL, seed=7, num_inference_steps=6, height=64, width=64)
    values.update(overrides)
    return GenerationParams(**values)


def mixed_workload() -> list[GenerationParams]:
    """Sizes, steps, seeds, guidance and references all differ; two jobs have a reference image."""
    reference = png_data_uri(reference_picture())
    return [
        flux2_params(prompt="a red fox", seed=1, num_inference_steps=8, guidance_scale=4.0),
        flux2_params(prompt="a blue bird", seed=2, num_inference_steps=4, guidance_scale=1.0, height=96),
        flux2_params(prompt="snow", seed=3, num_inference_steps=6, guidance_scale=6.0, init_image=reference),
        flux2_params(prompt="an old castle", seed=4, num_inference_steps=5, guidance_scale=2.5, width=128),
        flux2_params(
            prompt="a calm lake", seed=5, num_inference_steps=4, init_image=reference, height=None, width=None
        ),
    ]


@pytest.fixture(scope="module")
def engines():
    built = {
        "solo": DiffusionEngine(EngineConfig(model=MODEL, device="cpu", max_num_seqs=1)),
        "batched": DiffusionEngine(EngineConfig(model=MODEL, device="cpu", max_num_seqs=5, max_num_groups=1)),
    }
    yield built
    for engine in built.values():
        engine.shutdown(abort=True)


def test_staggered_jobs_of_different_sizes_and_references_share_forwards_each_equal_to_itself_alone(engines):
    workload = mixed_workload()
    computed_before = engines["solo"].stats()["tokens_computed"]
    alone = run_alone(engines["solo"], workload)
    computed_alone = engines["solo"].stats()["tokens_computed"] - computed_before
    before = engines["batched"].stats()

    together = run_staggered(engines["batched"], workload)

    assert [image.size for image in together] == [(64, 64), (64, 96), (64, 64), (128, 64), (80, 64)]
    for params, image_alone, image_together in zip(workload, alone, together):
        assert max_pixel_diff(image_alone, image_together) <= 1, params.prompt
    stats = engines["batched"].stats()
    assert max(stats["jobs_per_forward"]) == len(workload)
    assert max(stats["sizes_per_forward"]) >= 3, "rows of different sizes shared forwards"
    assert stats["tokens_padded"] == before["tokens_padded"], "sizes and references packed, not padded"
    assert stats["tokens_computed"] - before["tokens_computed"] == computed_alone


def test_a_reference_image_job_equals_diffusers_pipeline_given_the_same_image(engines):
    picture = reference_picture()
    params = flux2_params(prompt="snow", seed=3, init_image=png_data_uri(picture), height=None, width=None)
    others = [flux2_params(seed=9), flux2_params(seed=10, height=96, guidance_scale=2.0)]
    expected = own_pipeline_image(own_pipeline(MODEL, "Flux2Pipeline"), params, image=picture)

    futures = [engines["batched"].submit(p) for p in [params, *others]]  # co-batched with plain jobs
    image = futures[0].result(timeout=120).image
    for future in futures[1:]:
        future.result(timeout=120)

    assert (params.width, params.height) == image.size == expected.size == (80, 64)  # the pipeline's crop
    assert max_pixel_diff(image, expected) <= 2
    plain = own_pipeline_image(own_pipeline(MODEL, "Flux2Pipeline"), flux2_params(prompt="snow", seed=3, width=80))
    assert max_pixel_diff(image, plain) > 3, "the reference image changes the picture"


def test_deterministic_mode_is_bit_identical_with_reference_images_and_plain_jobs_co_batched():
    workload = [params for params in mixed_workload() if params.height == 64 and params.width == 64]
    engine = DiffusionEngine(EngineConfig(model=MODEL, device="cpu", max_num_seqs=3, deterministic=True))
    try:
        alone = run_alone(engine, workload)
        together = run_staggered(engine, workload)
        assert max(engine.stats()["jobs_per_forward"]) == len(workload)
    finally:
        engine.shutdown(abort=True)

    assert any(params.init_image for params in workload)
    for image_alone, image_together in zip(alone, together):
        assert (pixels(image_alone) == pixels(image_together)).all()


@pytest.mark.parametrize("field, value", [("mask_image", "mask"), ("resize_mode", "crop")])
def test_fields_that_start_from_an_image_are_refused_with_a_reference_image_naming_them(field, value):
    reference = png_data_uri(reference_picture())
    value = reference if value == "mask" else value

    with pytest.raises(InvalidParamsError) as error:
        flux2_params(init_image=reference, **{field: value})

    assert error.value.field == field


def test_a_reference_job_runs_every_step_whatever_its_strength():
    params = flux2_params(init_image=png_data_uri(reference_picture()), strength=0.5)

    assert params.steps_to_run() == params.num_inference_steps


def test_a_reference_the_pipeline_would_refuse_is_refused_at_submit_naming_init_image(engines):
    tiny = flux2_params(init_image=png_data_uri(reference_picture(48, 64)))  # under 64 pixels on a side
    long = flux2_params(init_image=png_data_uri(Image.new("RGB", (1024, 96))))  # an aspect ratio over 8:1

    for params in (tiny, long):
        with pytest.raises(InvalidParamsError) as error:
            engines["solo"].submit(params)
        assert error.value.field == "init_image"


def test_a_large_reference_sets_the_size_the_pipeline_would_scale_it_to():
    picture = Image.fromarray(np.full((1000, 2100, 3), 128, dtype=np.uint8))

    params = GenerationParams(prompt="a fox", model=MODEL, init_image=png_data_uri(picture))

    # Area capped at 1024 * 1024 (scale 0.7066...: 1483 x 706), then floored to multiples of 16.
    assert (params.width, params.height, params.strength) == (1472, 704, 1.0)


KLEIN = "builtin:tiny-flux2-klein"


def test_klein_runs_true_cfg_rows_beside_single_rows_each_equal_to_itself_alone_and_to_diffusers():
    reference = png_data_uri(reference_picture())
    workload = [
        flux2_params(model=KLEIN, prompt="a red fox", seed=1, num_inference_steps=5, guidance_scale=4.0),
        flux2_params(model=KLEIN, prompt="a blue bird", seed=2, num_inference_steps=3, guidance_scale=1.0, height=96),
        flux2_params(model=KLEIN, prompt="snow", seed=3, num_inference_steps=3, negative_prompt="blurry"),
        flux2_params(model=KLEIN, prompt="a calm lake", seed=4, num_inference_steps=3, init_image=reference),
    ]
    engine = DiffusionEngine(EngineConfig(model=KLEIN, device="cpu", max_num_seqs=4, max_num_groups=1))
    try:
        alone = run_alone(engine, workload)
        computed_alone = engine.stats()["tokens_computed"]
        together = run_staggered(engine, workload)
        stats = engine.stats()
    finally:
        engine.shutdown(abort=True)

    for params, image_alone, image_together in zip(workload, alone, together):
        assert max_pixel_diff(image_alone, image_together) <= 1, params.prompt
    assert stats["family"] == "flux2_klein"
    assert max(stats["rows_per_forward"]) >= 5, "CFG jobs' two rows beside a job's one"
    assert stats["tokens_padded"] == 0 and stats["tokens_computed"] == 2 * computed_alone, "packed, not padded"
    pipeline = own_pipeline(KLEIN, "Flux2KleinPipeline")  # its unconditional prompt is always empty
    for params, image in [(workload[0], alone[0]), (workload[3], alone[3])]:
        expected = own_pipeline_image(pipeline, params, image=reference_picture() if params.init_image else None)
        assert max_pixel_diff(image, expected) <= 2


def test_a_reference_image_counts_in_what_its_job_costs_each_forward():
    from batching.sample import make_samples
    from core.families import FAMILIES
    from core.image_inputs import input_images

    params = flux2_params(init_image=png_data_uri(reference_picture()))  # a 64x64 job, an 80x64 reference
    (plain,) = make_samples("plain", flux2_params(), FAMILIES["flux2"])
    (with_reference,) = make_samples("edit", params, FAMILIES["flux2"], images=input_images(params, "flux2"))

    assert (plain.cost, with_reference.cost) == (4 * 4, 4 * 4 + 5 * 4)  # tokens: 16-pixel patches
