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
from batching.pipelines.latent_rgb import HiddenLayer, LatentRgb, fit_latent_rgb
from batching.previews import MAX_PREVIEW_SIDE, Preview, PreviewPixels
from batching.shapes.checker import palette_labels
from core.errors import InvalidParamsError
from core.shapes_vocabulary import COLOURS, parse_prompt
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

    # Its first image's step 2 (of its 4; not its last), at the job's progress: its own steps, not 12.
    assert [(preview.step, preview.total) for preview in previews] == [(2, 4)]


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

    to_rgb = fitted.on(torch.device("cpu"))
    assert fitted.source == "fitted" and fitted.num_channels == 4
    assert torch.allclose(to_rgb.factors, true_factors, atol=0.02) and torch.allclose(to_rgb.bias, true_bias, atol=0.02)


def test_factors_survive_their_file(tmp_path):
    factors = LatentRgb(((0.1, 0.2, 0.3), (-0.4, 0.5, -0.6)), (0.01, 0.02, 0.03), "fitted")

    factors.save(tmp_path)

    assert LatentRgb.load(tmp_path / "latent_rgb.json") == factors


def test_a_map_with_a_hidden_layer_survives_its_file_and_maps_through_the_layer(tmp_path):
    hidden = HiddenLayer(weights=((1.0, -1.0), (0.5, 2.0), (0.0, 1.0)), bias=(0.1, -0.2))  # 3 channels, 2 units
    mapped = LatentRgb(((0.3, 0.2, 0.1), (-0.4, 0.5, 0.6)), (0.01, 0.02, 0.03), "fitted", hidden)
    grid = torch.tensor([0.5, -1.0, 2.0]).reshape(3, 1, 1)  # one position

    mapped.save(tmp_path)
    rgb = LatentRgb.load(tmp_path / "latent_rgb.json").on(torch.device("cpu"))(grid)

    units = torch.nn.functional.silu(torch.tensor([0.5 - 0.5 + 0.1, -0.5 - 2.0 + 2.0 - 0.2]))
    expected = units @ torch.tensor(mapped.factors) + torch.tensor(mapped.bias)
    assert LatentRgb.load(tmp_path / "latent_rgb.json") == mapped and mapped.num_channels == 3
    assert torch.allclose(rgb[0, 0], expected)


SHAPES_PROMPTS = (
    "a red circle on a blue background",
    "a green square on a yellow background",
    "a blue square on a white background",  # a linear map previewed it navy on yellow
    "a white circle on a black background",
)


def dominant_colours(image: Image.Image) -> tuple[str, str]:
    """(the border's palette colour, the centre's): what a glance at a shapes picture takes in."""
    labels = palette_labels(image.convert("RGB").resize((128, 128), Image.Resampling.BILINEAR))  # [128, 128]
    border = np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])
    centre = labels[56:72, 56:72].ravel()

    def most_common(values: np.ndarray) -> str:
        counts = np.bincount(values + 1, minlength=len(COLOURS) + 1)  # -1 (no palette colour) counts too
        index = int(counts.argmax()) - 1
        return list(COLOURS)[index] if index >= 0 else "none"

    return most_common(border), most_common(centre)


@pytest.mark.parametrize("model", ["builtin:shapes", "builtin:shapes-dit"])
def test_the_shapes_models_late_previews_show_the_dominant_colours_of_their_final_image(model):
    """The shapes models are trained: a late preview must show its own image's background and shape colours
    (the shapes-dit, a flow-matching model, previews its sampler's estimate of the final latents)."""
    engine = DiffusionEngine(EngineConfig(model=model, device="cpu", max_num_seqs=len(SHAPES_PROMPTS)))
    try:
        previews: dict[str, list[Preview]] = {prompt: [] for prompt in SHAPES_PROMPTS}
        futures = {
            prompt: engine.submit(
                GenerationParams(prompt=prompt, model=model, seed=3, num_inference_steps=20, height=128, width=128),
                preview_every=16,
                on_preview=previews[prompt].append,
            )
            for prompt in SHAPES_PROMPTS
        }
        images = {prompt: future.result(timeout=180).image for prompt, future in futures.items()}
    finally:
        engine.shutdown()

    for prompt in SHAPES_PROMPTS:
        (preview,) = previews[prompt]
        assert preview.step == 16
        asked = parse_prompt(prompt)
        assert asked is not None and dominant_colours(images[prompt]) == (asked.background, asked.foreground), prompt
        assert dominant_colours(preview.image()) == dominant_colours(images[prompt]), prompt


def test_the_flow_matching_sampler_estimates_the_final_latents_and_steps_as_diffusers_does():
    from diffusers import FlowMatchEulerDiscreteScheduler

    from batching.pipelines.flow_matching import FlowMatchSampler

    ours, theirs = FlowMatchSampler(), FlowMatchEulerDiscreteScheduler()
    for sampler in (ours, theirs):
        sampler.set_timesteps(num_inference_steps=4)
    generator = torch.Generator().manual_seed(0)
    final, noise = torch.randn(1, 4, 8, 8, generator=generator), torch.randn(1, 4, 8, 8, generator=generator)
    sigma = float(ours.sigmas[1])
    for sampler in (ours, theirs):
        sampler.step(noise - final, sampler.timesteps[0], noise, return_dict=False)  # to the second step
    latents = (1 - sigma) * final + sigma * noise  # [1, 4, 8, 8], on the straight path a flow model walks

    next_latents, estimate = ours.step(noise - final, ours.timesteps[1], latents, return_dict=False)
    (expected,) = theirs.step(noise - final, theirs.timesteps[1], latents, return_dict=False)

    assert torch.equal(next_latents, expected)
    assert torch.allclose(estimate, final, atol=1e-5)
