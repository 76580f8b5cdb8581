"""Inpainting UNets (9 input channels) on builtin:tiny-inpaint, and an SDXL one built here (CPU, 64x64, 6 steps).

An inpainting job must equal diffusers' own StableDiffusionInpaintPipeline for the same
seed, strength and steps (no latent blend: the mask and the masked image's latents are
UNet inputs); jobs with different masks, and text-to-image jobs, share forwards and each
equals itself alone. A job without a mask repaints everything: it equals diffusers'
inpaint pipeline given an all-white mask.
"""

from __future__ import annotations

import diffusers
import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from batching import DiffusionEngine, EngineConfig, GenerationParams
from tests.support.engines import (
    assert_together_equals_alone,
    max_pixel_diff,
    own_pipeline,
    own_pipeline_image,
    pixels,
    run_alone,
)
from tests.support.pictures import init_picture, png_data_uri, right_half_mask

MODEL = "builtin:tiny-inpaint"


def disc_mask(size: int = 64) -> Image.Image:
    mask = Image.new("L", (size, size), 0)
    ImageDraw.Draw(mask).ellipse((4, 4, 40, 40), fill=255)
    return mask


def params_for(**overrides) -> GenerationParams:
    values = dict(
        prompt="a red fox",
        model=MODEL,
        seed=11,
        num_inference_steps=6,
        height=64,
        width=64,
        guidance_scale=7.5,
        init_image=png_data_uri(init_picture()),
        mask_image=png_data_uri(right_half_mask()),
        strength=1.0,
    )
    values.update(overrides)
    return GenerationParams(**values)


@pytest.fixture(scope="module")
def engine():
    engine = DiffusionEngine(EngineConfig(model=MODEL, device="cpu", max_num_seqs=4))
    yield engine
    engine.shutdown(abort=True)


@pytest.fixture(scope="module")
def pipeline():
    pipeline = own_pipeline(MODEL, "StableDiffusionInpaintPipeline")
    pipeline.scheduler = diffusers.EulerDiscreteScheduler.from_config(pipeline.scheduler.config)  # jobs' default
    assert pipeline.unet.config.in_channels == 9
    return pipeline


def diffusers_image(pipeline, params: GenerationParams, image, mask: Image.Image) -> Image.Image:
    return own_pipeline_image(pipeline, params, image=image, mask_image=mask, strength=params.strength)


@pytest.mark.parametrize("strength", [1.0, 0.5])
def test_an_inpainting_job_equals_diffusers_inpaint_pipeline_with_a_nine_channel_unet(engine, pipeline, strength):
    mask = right_half_mask()
    params = params_for(strength=strength)
    # The engine puts the init image's own pixels back outside the mask (diffusers' apply_overlay).
    expected = Image.composite(diffusers_image(pipeline, params, init_picture(), mask), init_picture(), mask)
    progress: list[tuple[int, int]] = []

    image = engine.submit(params, on_progress=lambda done, total: progress.append((done, total))).result(120).image

    assert max_pixel_diff(image, expected) <= 2
    repaint = np.asarray(mask) > 0
    assert np.abs(pixels(image)[repaint] - pixels(init_picture())[repaint]).mean() >= 20, "the masked region changed"
    steps = int(6 * strength)
    assert progress[-1] == (steps, steps)


@pytest.mark.parametrize("has_init_image", [True, False], ids=["img2img", "text-to-image"])
def test_a_job_without_a_mask_repaints_everything_as_diffusers_does_with_an_all_white_mask(
    engine, pipeline, has_init_image
):
    params = params_for(
        mask_image=None,
        init_image=png_data_uri(init_picture()) if has_init_image else None,
        strength=0.5 if has_init_image else None,
    )
    picture = init_picture() if has_init_image else Image.new("RGB", (64, 64))
    # The masked image is then all zeros; a uniform image through the random tiny VAE is ill-conditioned
    # (its latents change by 0.5 with the tensor's memory layout alone), so diffusers gets the pixels in the
    # engine's contiguous layout rather than the channels-last one its image processor makes from a PIL image.
    picture_tensor = torch.from_numpy(np.asarray(picture, dtype=np.float32) / 255).permute(2, 0, 1)[None]  # [0, 1]
    expected = diffusers_image(pipeline, params, picture_tensor.contiguous(), Image.new("L", (64, 64), 255))

    image = engine.submit(params).result(120).image

    assert max_pixel_diff(image, expected) <= 2


def test_inpainting_jobs_with_different_masks_share_forwards_and_each_equals_itself_alone(engine):
    jobs = [
        params_for(),
        params_for(prompt="a blue bird", seed=3, mask_image=png_data_uri(disc_mask())),
        params_for(prompt="snow", seed=5, strength=0.8, num_inference_steps=5, guidance_scale=1.0),  # one row
        params_for(prompt="a castle", seed=8, init_image=None, mask_image=None, strength=None),  # text-to-image
    ]
    together = assert_together_equals_alone(engine, jobs)
    assert max_pixel_diff(together[0], together[1]) > 10, "different masks and prompts give different images"


def test_deterministic_mode_pads_the_mask_channels_and_keeps_jobs_bit_identical():
    engine = DiffusionEngine(EngineConfig(model=MODEL, device="cpu", max_num_seqs=3, deterministic=True))
    try:
        jobs = [
            params_for(num_inference_steps=3),
            params_for(prompt="a castle", seed=4, mask_image=png_data_uri(disc_mask()), num_inference_steps=3),
        ]
        alone = run_alone(engine, jobs)  # each forward padded to 6 rows

        together = [future.result(timeout=120).image for future in [engine.submit(params) for params in jobs]]
    finally:
        engine.shutdown(abort=True)

    for image_alone, image_together in zip(alone, together):
        assert (pixels(image_alone) == pixels(image_together)).all()


@pytest.fixture(scope="module")
def sdxl_inpaint_folder(tmp_path_factory):
    """An SDXL inpainting checkpoint at toy size: builtin:tiny-sdxl with a seeded 9-channel UNet."""
    from batching.builtin_model import build_builtin_pipeline
    from batching.builtin_models.components import seeded

    base = build_builtin_pipeline("builtin:tiny-sdxl")
    with seeded(5):
        unet = diffusers.UNet2DConditionModel.from_config({**base.unet.config, "in_channels": 9})
    components = {name: module for name, module in base.components.items() if name != "unet"}
    pipeline = diffusers.StableDiffusionXLInpaintPipeline(
        **components,
        unet=unet.eval(),
        requires_aesthetics_score=False,
        force_zeros_for_empty_prompt=True,
        add_watermarker=False,
    )
    folder = tmp_path_factory.mktemp("tiny-sdxl-inpaint")
    pipeline.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("strength", [1.0, 0.5])
def test_an_sdxl_inpainting_checkpoint_job_equals_diffusers_sdxl_inpaint_pipeline(sdxl_inpaint_folder, strength):
    mask = right_half_mask()
    model = str(sdxl_inpaint_folder)
    params = params_for(model=model, guidance_scale=5.0, strength=strength)
    pipeline = diffusers.StableDiffusionXLInpaintPipeline.from_pretrained(
        sdxl_inpaint_folder, local_files_only=True, add_watermarker=False
    )
    pipeline.set_progress_bar_config(disable=True)
    expected = Image.composite(diffusers_image(pipeline, params, init_picture(), mask), init_picture(), mask)
    engine = DiffusionEngine(EngineConfig(model=model, device="cpu", max_num_seqs=2))
    try:
        image = engine.submit(params).result(timeout=120).image
    finally:
        engine.shutdown(abort=True)

    assert max_pixel_diff(image, expected) <= 2


def test_an_sdxl_checkpoint_that_conditions_on_aesthetic_scores_is_refused_at_load(sdxl_inpaint_folder, tmp_path):
    import json
    import shutil

    from core.errors import ModelLoadError

    folder = tmp_path / "refiner-like"
    shutil.copytree(sdxl_inpaint_folder, folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "requires_aesthetics_score": True}))

    with pytest.raises(ModelLoadError, match="requires_aesthetics_score"):
        DiffusionEngine(EngineConfig(model=str(folder), device="cpu"))
