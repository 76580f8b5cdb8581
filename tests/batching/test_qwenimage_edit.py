"""Qwen-Image-Edit (builtin:tiny-qwen-image-edit): edit jobs carry their image in every row and still share forwards.

Every edit row carries its edit image's ~4096 latent tokens (the pipeline sizes the image
to about 1024x1024 pixels), so these tests run few jobs of few steps; the engines cache an
image's latents, so a job run alone and then co-batched encodes its image once.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions
from PIL import Image, ImageDraw

from batching import DiffusionEngine, EngineConfig, GenerationParams, InvalidParamsError
from tests.support.engines import max_pixel_diff, pixels, run_alone, run_staggered
from tests.support.pictures import png_data_uri

MODEL = "builtin:tiny-qwen-image-edit"


def picture(width: int, height: int, colour: tuple[int, int, int]) -> Image.Image:
    """A gradient with a disc: structure the edit image's latents keep."""
    ramp = np.linspace(0, 255, width, dtype=np.float32)
    array = np.stack([np.tile(ramp, (height, 1)), np.tile(np.linspace(255, 0, height)[:, None], (1, width))], -1)
    image = Image.fromarray(np.concatenate([array, np.full((height, width, 1), 90.0)], -1).astype(np.uint8))
    ImageDraw.Draw(image).ellipse((4, 4, width // 2, height // 2), fill=colour)
    return image


LANDSCAPE = png_data_uri(picture(64, 48, (250, 40, 40)))  # edited at 1184x896: 74x56 latent patches
PORTRAIT = png_data_uri(picture(48, 64, (40, 40, 250)))  # 896x1184: the same count, transposed


def edit_params(**overrides) -> GenerationParams:
    values = dict(prompt="make it red", model=MODEL, seed=7, num_inference_steps=2, height=64, width=64)
    values.update(overrides)
    values.setdefault("init_image", LANDSCAPE)
    return GenerationParams(**values)


@pytest.fixture(scope="module")
def engines():
    built = {
        "batched": DiffusionEngine(  # images decoded on the decoder's thread while the loop encodes edit images
            EngineConfig(model=MODEL, device="cpu", max_num_seqs=4, max_num_groups=1, decode_overlap=True)
        ),
        "deterministic": DiffusionEngine(EngineConfig(model=MODEL, device="cpu", max_num_seqs=2, deterministic=True)),
    }
    yield built
    for engine in built.values():
        engine.shutdown(abort=True)


def test_edit_jobs_of_different_images_sizes_and_guidance_join_at_staggered_steps_each_equal_to_itself_alone(engines):
    params_list = [
        edit_params(seed=1, num_inference_steps=3, negative_prompt="blurry"),
        edit_params(seed=2, height=96, prompt="a blue bird over the sea at night"),
        edit_params(seed=3, init_image=PORTRAIT, width=96, guidance_scale=6.0, negative_prompt="dark, low quality"),
    ]
    engine = engines["batched"]
    computed_before = engine.stats()["tokens_computed"]
    alone = run_alone(engine, params_list)
    computed_alone = engine.stats()["tokens_computed"] - computed_before
    before = engine.stats()

    together = run_staggered(engine, params_list)

    assert [image.size for image in together] == [(p.width, p.height) for p in params_list]
    for image_alone, image in zip(alone, together):
        assert max_pixel_diff(image_alone, image) <= 1
    stats = engine.stats()
    assert stats["sizes_per_forward"].get(3, 0) > before["sizes_per_forward"].get(3, 0), "all three sizes in one"
    assert stats["tokens_padded"] == before["tokens_padded"], "edit images, sizes and prompts packed, not padded"
    assert stats["tokens_computed"] - before["tokens_computed"] == computed_alone


def test_an_edit_job_equals_diffusers_own_edit_pipeline_for_the_same_seed(engines):
    from batching.builtin_model import builtin_model_path
    from batching.pipelines.qwenimage.edit import QwenImageEditAdapter

    params = edit_params(negative_prompt="blurry", guidance_scale=5.0)
    image = engines["batched"].submit(params).result(timeout=300).image
    pipeline = QwenImageEditAdapter.load_pipeline(
        MODEL, str(builtin_model_path(MODEL)), torch.device("cpu"), torch.float32
    )
    pipeline.set_progress_bar_config(disable=True)

    expected = pipeline(
        image=picture(64, 48, (250, 40, 40)),
        prompt=params.prompt,
        negative_prompt=params.negative_prompt,
        true_cfg_scale=params.guidance_scale,
        height=params.height,
        width=params.width,
        num_inference_steps=params.num_inference_steps,
        generator=torch.Generator("cpu").manual_seed(params.seed),
    ).images[0]

    assert max_pixel_diff(image, expected) <= 2
    assert max_pixel_diff(image, engines["batched"].submit(edit_params(init_image=PORTRAIT)).result(300).image) > 8


def test_deterministic_mode_is_bit_identical_alone_and_co_batched(engines):
    params_list = [
        edit_params(seed=4, num_inference_steps=3, negative_prompt="blurry"),
        edit_params(seed=5, prompt="snow", guidance_scale=1.0),
    ]
    engine = engines["deterministic"]
    alone = run_alone(engine, params_list)

    together = run_staggered(engine, params_list)

    for image_alone, image in zip(alone, together):
        assert (pixels(image_alone) == pixels(image)).all()


def test_an_edit_job_without_its_image_or_with_a_mask_is_refused_at_submit_naming_the_field(engines):
    engine = engines["batched"]
    with pytest.raises(InvalidParamsError) as missing:
        engine.submit(GenerationParams(prompt="make it red", model=MODEL, height=64, width=64))
    with pytest.raises(InvalidParamsError) as masked:
        edit_params(mask_image=LANDSCAPE)
    with pytest.raises(InvalidParamsError) as narrow:
        edit_params(init_image=png_data_uri(Image.new("RGB", (6000, 1))))

    assert (missing.value.field, masked.value.field, narrow.value.field) == ("init_image", "mask_image", "init_image")


@pytest.mark.parametrize("size", [(64, 48), (48, 64), (300, 100), (1000, 1000)])
def test_an_edit_job_without_a_size_gets_the_edit_pipeline_s_size_for_its_image(size):
    params = GenerationParams(prompt="make it red", model=MODEL, init_image=png_data_uri(Image.new("RGB", size)))

    width, height, _ = calculate_dimensions(1024 * 1024, size[0] / size[1])
    assert (params.width, params.height) == (width // 16 * 16, height // 16 * 16)
    assert params.strength == 1.0 and params.steps_to_run() == params.num_inference_steps
