"""Live previews on the engine's side: when they come, that they leave the image alone, their size, the factors.

The service's side (the worker encodes them onto a job's event stream) is tested end to end in
tests/api/test_live_end_to_end.py."""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from batching import DiffusionEngine, EngineConfig, GenerationParams
from batching.pipelines.latent_rgb import LatentRgb, fit_latent_rgb
from batching.previews import MAX_PREVIEW_SIDE, Preview, PreviewPixels
from core.errors import InvalidParamsError
from tests.support.engines import make_params, max_pixel_diff


def test_previews_are_off_unless_a_job_asks_for_them(batched_engine):
    previews: list[Preview] = []

    batched_engine.submit(make_params(seed=11), on_preview=previews.append).result(timeout=60)

    assert previews == []


def test_a_job_gets_a_preview_every_k_steps_but_not_after_its_last_and_the_same_image(batched_engine):
    params = make_params(seed=12, num_inference_steps=8, sampler="euler")
    previews: list[Preview] = []

    with_previews = batched_engine.submit(params, preview_every=3, on_preview=previews.append)
    without = batched_engine.submit(params)  # the same job beside it, in the same forwards

    assert max_pixel_diff(with_previews.result(timeout=60).image, without.result(timeout=60).image) <= 1
    assert [(preview.step, preview.total) for preview in previews] == [(3, 8), (6, 8)]
    assert previews[0].pixels.array().shape == (64 // 8, 64 // 8, 3)  # the latent grid: no VAE ran for it


@pytest.mark.parametrize("sampler", ["ddim", "dpmpp_2m"])
def test_previews_leave_the_image_of_each_sampler_unchanged(batched_engine, sampler):
    params = make_params(seed=13, num_inference_steps=6, sampler=sampler, width=96)
    previews: list[Preview] = []

    with_previews = batched_engine.submit(params, preview_every=1, on_preview=previews.append).result(timeout=60)
    without = batched_engine.submit(params).result(timeout=60)

    assert max_pixel_diff(with_previews.image, without.image) <= 1
    assert [preview.step for preview in previews] == [1, 2, 3, 4, 5]


def test_a_job_of_several_images_previews_its_first(batched_engine):
    previews: list[Preview] = []

    batched_engine.submit(
        make_params(seed=14, num_images=3, num_inference_steps=4), preview_every=2, on_preview=previews.append
    ).result(timeout=60)

    assert [preview.total for preview in previews] == [12]  # its first image's step 2 (of its 4; not its last)


def test_a_preview_every_that_is_not_a_count_is_refused_naming_the_field(batched_engine):
    with pytest.raises(InvalidParamsError, match="preview_every"):
        batched_engine.submit(make_params(), preview_every=-1, on_preview=print)


def test_a_preview_keeps_its_images_aspect_and_is_at_most_256_pixels_on_the_long_side():
    grid = PreviewPixels(torch.zeros(64, 128, 3, dtype=torch.uint8))  # a 1024x512 image's latent grid

    big = Preview(step=4, total=20, width=1024, height=512, pixels=grid)
    small_grid = PreviewPixels(torch.zeros(8, 12, 3, dtype=torch.uint8))
    small = Preview(step=4, total=20, width=96, height=64, pixels=small_grid)
    uri = big.data_uri()

    assert big.image().size == (MAX_PREVIEW_SIDE, MAX_PREVIEW_SIDE // 2)
    assert small.image().size == (96, 64)  # never larger than the image
    assert uri.startswith("data:image/jpeg;base64,")
    assert Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).size == (256, 128)


def test_the_fit_recovers_a_vae_that_is_a_linear_map_of_its_latents():
    true_factors = torch.tensor([[0.5, -0.2, 0.1], [0.0, 0.4, -0.3], [-0.6, 0.1, 0.2], [0.2, 0.2, 0.2]])
    true_bias = torch.tensor([0.1, -0.1, 0.05])

    def decode(latents, params_list):  # [1, 4, 8, 8] -> one 64x64 image: each latent position's colour, 8x8 pixels
        rgb = (torch.einsum("chw,cr->rhw", latents[0], true_factors) + true_bias[:, None, None]).clamp(-1, 1)
        big = rgb.repeat_interleave(8, 1).repeat_interleave(8, 2)  # [3, 64, 64]
        array = ((big.permute(1, 2, 0) + 1) * 127.5).round().to(torch.uint8).numpy()
        return [Image.fromarray(array)]

    adapter = SimpleNamespace(
        model="builtin:tiny",
        draw_noise=lambda params, generator: 0.4 * torch.randn(1, 4, 8, 8, generator=generator),
        preview_latents=lambda latents, params: latents[0],
        decode=decode,
    )

    fitted = fit_latent_rgb(adapter, size=64)  # type: ignore[arg-type]  # the parts of an adapter the fit uses

    factors, bias = fitted.tensors(torch.device("cpu"), torch.float32)
    assert fitted.source == "fitted" and fitted.num_channels == 4
    assert torch.allclose(factors, true_factors, atol=0.02) and torch.allclose(bias, true_bias, atol=0.02)


def test_factors_survive_their_file(tmp_path):
    factors = LatentRgb(((0.1, 0.2, 0.3), (-0.4, 0.5, -0.6)), (0.01, 0.02, 0.03), "fitted")

    factors.save(tmp_path)

    assert LatentRgb.load(tmp_path / "latent_rgb.json") == factors


@pytest.mark.parametrize("model", ["builtin:shapes", "builtin:shapes-dit"])
def test_the_shapes_models_previews_show_the_colours_of_the_picture_it_draws(model):
    """The shapes models are trained: their late previews must look like their own image, not another prompt's."""
    engine = DiffusionEngine(EngineConfig(model=model, device="cpu", max_num_seqs=2))
    try:
        previews: dict[str, list[Preview]] = {"red": [], "green": []}
        futures = {
            colour: engine.submit(
                GenerationParams(prompt=prompt, model=model, seed=3, num_inference_steps=20, height=128, width=128),
                preview_every=16,
                on_preview=previews[colour].append,
            )
            for colour, prompt in (
                ("red", "a red circle on a blue background"),
                ("green", "a green square on a yellow background"),
            )
        }
        images = {colour: future.result(timeout=120).image for colour, future in futures.items()}
    finally:
        engine.shutdown()

    def distance(preview: Preview, image) -> float:
        shown = np.asarray(preview.image(), float)
        return float(np.abs(shown - np.asarray(image.resize(preview.image().size), float)).mean())

    for colour, other in (("red", "green"), ("green", "red")):
        (preview,) = previews[colour]
        assert preview.step == 16
        assert distance(preview, images[colour]) < 0.6 * distance(preview, images[other]), colour
