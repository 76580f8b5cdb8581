"""Image-to-image and inpainting in the engine, per family, on the tiny built-ins (CPU, 64x64, few steps).

An img2img sample must equal the family's own diffusers img2img pipeline for the same
seed, strength and steps; co-batched with text-to-image samples it must equal itself
alone; an inpainting sample keeps the unmasked region of its init image and repaints
the masked one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest
from PIL import Image

import core.image_inputs as image_inputs
from batching import DiffusionEngine, EngineConfig, GenerationParams
from tests.support.engines import (
    assert_together_equals_alone,
    max_pixel_diff,
    num_shared_forwards,
    own_pipeline,
    own_pipeline_image,
    pixels,
    run_alone,
)
from tests.support.pictures import init_picture, png_data_uri, right_half_mask


@dataclass(frozen=True)
class Case:
    model: str
    img2img_pipeline: str  # diffusers' own img2img pipeline for the family
    guidance: float


CASES = [
    Case("builtin:tiny", "StableDiffusionImg2ImgPipeline", 7.5),
    Case("builtin:tiny-sdxl", "StableDiffusionXLImg2ImgPipeline", 5.0),
    Case("builtin:tiny-flux", "FluxImg2ImgPipeline", 3.5),
    Case("builtin:tiny-zimage", "ZImageImg2ImgPipeline", 4.0),
    Case("builtin:tiny-sd3", "StableDiffusion3Img2ImgPipeline", 7.0),
]


def params_for(case: Case, **overrides) -> GenerationParams:
    values = dict(
        prompt="a red fox",
        model=case.model,
        seed=11,
        num_inference_steps=6,
        height=64,
        width=64,
        guidance_scale=case.guidance,
        init_image=png_data_uri(init_picture()),
        strength=0.5,
    )
    values.update(overrides)
    return GenerationParams(**values)


def own_euler_pipeline(model: str, pipeline_class: str):
    """diffusers' own pipeline with the sampler jobs default to (the SD built-in ships DDIM; jobs run euler)."""
    import diffusers

    pipeline = own_pipeline(model, pipeline_class)
    if isinstance(pipeline.scheduler, diffusers.DDIMScheduler):
        pipeline.scheduler = diffusers.EulerDiscreteScheduler.from_config(pipeline.scheduler.config)
    if pipeline_class == "StableDiffusion3InpaintPipeline":
        add_back_the_vae_shift_at_decode(pipeline)
    return pipeline


def add_back_the_vae_shift_at_decode(pipeline) -> None:
    """diffusers 0.42.1's SD3 inpaint pipeline decodes `latents / scaling_factor` without adding the VAE's
    `shift_factor` back, unlike its own encode and every other SD3 pipeline (huggingface/diffusers#13611, issue 1).
    The engine decodes as the others do; the reference gets the shift back before its one decode call."""
    decode, shift = pipeline.vae.decode, pipeline.vae.config.shift_factor
    pipeline.vae.decode = lambda latents, *args, **kwargs: decode(latents + shift, *args, **kwargs)


@pytest.fixture(scope="module", params=CASES, ids=lambda case: case.model)
def case_engine(request):
    engine = DiffusionEngine(EngineConfig(model=request.param.model, device="cpu", max_num_seqs=4))
    yield request.param, engine
    engine.shutdown(abort=True)


def test_an_img2img_sample_equals_the_familys_own_diffusers_img2img_pipeline(case_engine):
    case, engine = case_engine
    params = params_for(case)
    pipeline = own_euler_pipeline(case.model, case.img2img_pipeline)
    expected = own_pipeline_image(pipeline, params, image=init_picture(), strength=params.strength)
    progress: list[tuple[int, int]] = []

    image = engine.submit(params, on_progress=lambda done, total: progress.append((done, total))).result(120).image

    assert max_pixel_diff(image, expected) <= 2
    assert progress[-1] == (3, 3), "progress counts the steps actually run: half of 6"


def test_img2img_co_batched_with_text_to_image_equals_itself_alone(case_engine):
    case, engine = case_engine
    jobs = [
        params_for(case),
        params_for(case, prompt="a blue bird", seed=3, init_image=None, strength=None),
        params_for(case, prompt="snow", seed=5, strength=0.8, num_inference_steps=5),
        params_for(case, prompt="a castle", seed=8, init_image=None, strength=None, num_inference_steps=4),
    ]
    assert_together_equals_alone(engine, jobs)


def test_inpainting_repaints_the_masked_region_as_diffusers_inpaint_pipeline_and_keeps_the_rest(case_engine):
    case, engine = case_engine
    mask = right_half_mask()
    params = params_for(case, mask_image=png_data_uri(mask), strength=1.0)
    pipeline = own_euler_pipeline(case.model, case.img2img_pipeline.replace("Img2Img", "Inpaint"))
    expected = own_pipeline_image(pipeline, params, image=init_picture(), mask_image=mask, strength=1.0)

    image = engine.submit(params).result(timeout=120).image

    repaint = np.asarray(mask) > 0
    result, init = pixels(image), pixels(init_picture())
    assert (result[~repaint] == init[~repaint]).all(), "outside the mask the init image's own pixels are kept"
    assert np.abs(result[repaint] - pixels(expected)[repaint]).max() <= 2, "the masked region is diffusers' inpaint"
    assert np.abs(result[repaint] - init[repaint]).mean() >= 20, "the masked region was repainted"


def test_a_jobs_input_images_are_decoded_once_at_submit_and_its_kept_region_composited_beside_the_loop(
    batched_engine, monkeypatch
):
    decoded, composited = [], []
    real_open, real_composite = image_inputs.open_image, Image.composite

    def open_image(field, data):
        decoded.append((field, threading.current_thread().name))
        return real_open(field, data)

    def composite(*images):
        composited.append(threading.current_thread().name)
        return real_composite(*images)

    monkeypatch.setattr(image_inputs, "open_image", open_image)
    monkeypatch.setattr(Image, "composite", composite)
    mask = right_half_mask()
    params = params_for(CASES[0], mask_image=png_data_uri(mask), strength=1.0, num_images=2, num_inference_steps=2)

    result = batched_engine.submit(params).result(timeout=120)

    caller = threading.current_thread().name
    assert decoded == [("init_image", caller), ("mask_image", caller)], "once per job, on the submitting thread"
    assert composited == ["stepwise-decode"] * 2, "one composite per image, on the decode worker"
    keep, init = np.asarray(mask) == 0, pixels(init_picture())
    assert all((pixels(image)[keep] == init[keep]).all() for image in result.images)


def test_deterministic_mode_keeps_img2img_and_inpainting_bit_identical_alone_and_co_batched(deterministic_engine):
    case, engine = CASES[0], deterministic_engine  # builtin:tiny, shared with the other deterministic tests
    jobs = [
        params_for(case, num_inference_steps=4),  # 2 steps run
        params_for(case, mask_image=png_data_uri(right_half_mask()), strength=0.75, seed=4, num_inference_steps=4),
        params_for(case, prompt="a castle", init_image=None, strength=None, seed=9, num_inference_steps=2),
    ]
    alone = run_alone(engine, jobs)
    shared_before = num_shared_forwards(engine)

    futures = [engine.submit(params) for params in jobs]  # admitted together: init images encoded together
    together = [future.result(timeout=120).image for future in futures]

    assert num_shared_forwards(engine) > shared_before, "the jobs shared forwards"

    for image_alone, image_together in zip(alone, together):
        assert (pixels(image_alone) == pixels(image_together)).all()
