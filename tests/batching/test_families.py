"""SDXL and the DiT families (FLUX.1, FLUX.2, Z-Image, Qwen-Image, SD3) through the one engine: every guarantee
the SD family has, per family, and the DiT families' rows of different sizes packed into one forward.

Each family runs on its tiny built-in at 64-128 px with few steps. The same assertions run
for every family (parametrized); what differs is only the family's own parameters
(FLUX has no CFG rows, so its mixed guidance is the embedded value).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from PIL import Image

from batching import DiffusionEngine, EngineConfig, GenerationParams, InvalidParamsError, ModelLoadError
from tests.support.engines import (
    max_pixel_diff,
    num_shared_forwards,
    own_pipeline,
    own_pipeline_image,
    pixels,
    run_alone,
    run_staggered,
)
from tests.support.pictures import png_data_uri

TINY_PNG = png_data_uri(Image.new("RGB", (64, 64), (200, 30, 30)))


@dataclass(frozen=True)
class Family:
    name: str
    model: str
    pipeline_class: str  # diffusers' own pipeline for the family
    guidances: tuple[float, ...]  # one per staggered sample; includes "none" where the family has CFG
    negative_prompt: str  # "" where the family refuses negative prompts
    guidance_name: str = "guidance_scale"  # the argument of diffusers' pipeline that guidance_scale is
    text_tokens: int | None = None  # every row's text tokens (the pipeline pads its prompts to them); None: each
    # prompt's own count (Z-Image, Qwen-Image), or not a packed family (SDXL)


FAMILIES = [
    Family("sdxl", "builtin:tiny-sdxl", "StableDiffusionXLPipeline", (5.0, 1.0, 8.0, 3.0), "blurry"),
    Family("flux", "builtin:tiny-flux", "FluxPipeline", (3.5, 1.0, 6.0, 2.0), "", text_tokens=512),
    Family("zimage", "builtin:tiny-zimage", "ZImagePipeline", (4.0, 0.0, 6.0, 2.0), "blurry"),
    # true CFG: the guided samples with a negative prompt run two rows, the others one (whatever their scale)
    Family(
        "qwenimage", "builtin:tiny-qwen-image", "QwenImagePipeline", (4.0, 1.0, 6.0, 2.0), "blurry", "true_cfg_scale"
    ),
    Family("sd3", "builtin:tiny-sd3", "StableDiffusion3Pipeline", (7.0, 1.0, 8.0, 3.0), "blurry", text_tokens=77 + 256),
    Family("flux2", "builtin:tiny-flux2", "Flux2Pipeline", (4.0, 1.0, 6.0, 2.0), "", text_tokens=512),
]


def family_params(family: Family, **overrides) -> GenerationParams:
    values = dict(
        prompt="a red fox",
        model=family.model,
        seed=7,
        num_inference_steps=6,
        height=64,
        width=64,
        guidance_scale=family.guidances[0],
    )
    values.update(overrides)
    return GenerationParams(**values)


def staggered_params(family: Family) -> list[GenerationParams]:
    """Four samples that differ in steps, seeds, prompts, guidance (none included) and negative prompts."""
    prompts = ("a red fox", "a blue bird over the sea", "snow", "an old castle at night")
    steps = (8, 4, 6, 5)
    return [
        family_params(
            family,
            prompt=prompt,
            seed=10 + index,
            num_inference_steps=num_steps,
            guidance_scale=guidance,
            negative_prompt=family.negative_prompt if index == 2 else "",
        )
        for index, (prompt, num_steps, guidance) in enumerate(zip(prompts, steps, family.guidances))
    ]


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda family: family.name)
def family(request):
    return request.param


@pytest.fixture(scope="module")
def engines(family):
    """A solo, a batched and a deterministic engine for the family (built once per family)."""
    built = {
        "solo": DiffusionEngine(EngineConfig(model=family.model, device="cpu", max_num_seqs=1)),
        "batched": DiffusionEngine(EngineConfig(model=family.model, device="cpu", max_num_seqs=4)),
        "deterministic": DiffusionEngine(
            EngineConfig(model=family.model, device="cpu", max_num_seqs=4, deterministic=True)
        ),
    }
    yield built
    for engine in built.values():
        engine.shutdown(abort=True)


def test_a_co_batched_sample_matches_itself_alone_and_forwards_carry_several(family, engines):
    params_list = staggered_params(family)
    before = engines["solo"].stats()["tokens_computed"]
    alone = run_alone(engines["solo"], params_list)
    computed_alone = engines["solo"].stats()["tokens_computed"] - before
    assert len({pixels(image).tobytes() for image in alone}) == len(params_list)
    before = engines["batched"].stats()

    batched = run_staggered(engines["batched"], params_list)

    for params, image_alone, image_batched in zip(params_list, alone, batched):
        assert max_pixel_diff(image_alone, image_batched) <= 1, f"guidance {params.guidance_scale} sample differs"
    stats = engines["batched"].stats()
    assert stats["family"] == family.name
    assert max(stats["jobs_per_forward"]) >= 3, stats["jobs_per_forward"]
    assert stats["tokens_computed"] - before["tokens_computed"] == computed_alone > 0, "rows of one size: no padding"
    assert stats["tokens_padded"] == before["tokens_padded"]


def test_deterministic_mode_is_bit_identical_alone_and_co_batched(family, engines):
    params_list = staggered_params(family)
    engine = engines["deterministic"]
    alone = run_alone(engine, params_list)
    assert engine.stats()["tokens_padded"] > 0, "a job alone runs beside padding rows, counted as padding"
    shared_before = num_shared_forwards(engine)

    batched = run_staggered(engine, params_list)

    assert num_shared_forwards(engine) > shared_before, "the samples shared forwards"
    for image_alone, image_batched in zip(alone, batched):
        assert (pixels(image_alone) == pixels(image_batched)).all()


@pytest.mark.parametrize(
    "model, field, value",
    [
        ("builtin:tiny-flux", "sampler", "dpmpp_2m"),
        ("builtin:tiny-flux", "width", 200),
        ("builtin:tiny-flux", "guidance_scale", 30.0),
        ("builtin:tiny-flux", "negative_prompt", "blurry"),
        ("builtin:tiny-zimage", "height", 72),
        ("builtin:tiny-zimage", "sampler", "euler_ancestral"),
        ("builtin:tiny-sdxl", "width", 60),
        ("builtin:tiny-qwen-image", "sampler", "ddim"),
        ("builtin:tiny-qwen-image", "height", 72),
        ("builtin:tiny-qwen-image", "guidance_scale", 51.0),
        ("builtin:tiny-qwen-image", "num_inference_steps", 1),  # its terminal shift needs two steps
        ("builtin:tiny-qwen-image", "init_image", TINY_PNG),  # its img2img pipeline is not served yet
        ("builtin:tiny-qwen-image-edit", "init_image", None),  # an edit job needs the image to edit
        ("builtin:tiny-sd3", "sampler", "dpmpp_2m"),
        ("builtin:tiny-sd3", "width", 72),  # the VAE's 8 x the 2x2 patches
        ("builtin:tiny-sd3", "guidance_scale", 60.0),
        ("builtin:tiny-flux2", "sampler", "euler_ancestral"),
        ("builtin:tiny-flux2", "height", 72),
        ("builtin:tiny-flux2", "guidance_scale", 25.0),
        ("builtin:tiny-flux2", "negative_prompt", "blurry"),
    ],
)
def test_params_a_family_does_not_support_are_refused_naming_the_field(model, field, value):
    with pytest.raises(InvalidParamsError) as error:
        GenerationParams(prompt="a fox", model=model, **{field: value})

    assert error.value.field == field


def test_each_family_has_its_own_defaults():
    flux = GenerationParams(prompt="a fox", model="builtin:tiny-flux")
    sdxl = GenerationParams(prompt="a fox", model="builtin:tiny-sdxl")

    assert (flux.guidance_scale, flux.sampler) == (3.5, "euler")
    assert sdxl.guidance_scale == 5.0
    assert GenerationParams(prompt="a fox").guidance_scale == 7.5


def test_a_folder_model_is_validated_against_its_family_at_submit():
    from batching.builtin_model import builtin_model_path

    folder = str(builtin_model_path("builtin:tiny-flux"))
    params = GenerationParams(prompt="a fox", model=folder, sampler="dpmpp_2m", height=64, width=64)
    engine = DiffusionEngine(EngineConfig(model=folder, device="cpu", max_num_seqs=1))
    try:
        assert engine.family == "flux"
        with pytest.raises(InvalidParamsError) as error:
            engine.submit(params)
        assert error.value.field == "sampler"
    finally:
        engine.shutdown(abort=True)


def test_a_checkpoint_of_an_unsupported_family_is_refused_naming_it_and_the_supported_ones(tmp_path):
    (tmp_path / "model_index.json").write_text(
        '{"_class_name": "HunyuanVideoPipeline", "_diffusers_version": "0.42.1"}'
    )

    with pytest.raises(ModelLoadError, match="HunyuanVideoPipeline.*FluxPipeline.*QwenImagePipeline.*WanPipeline"):
        DiffusionEngine(EngineConfig(model=str(tmp_path), device="cpu"))


# 64x64 has a quarter of 128x128's image tokens; 64x128 and 128x64 have equal counts on transposed grids
PACKED_SIZES = [(128, 128), (64, 64), (64, 128), (128, 64)]


def test_jobs_of_different_sizes_joining_at_staggered_steps_are_packed_without_padding_each_equal_to_itself_alone(
    family, engines
):
    """Four jobs of their own sizes (a 4x token ratio between two of them), step counts, seeds, prompts, guidance
    (none included) and negative prompts join a running group one step apart: every forward packs their tokens
    with no padding position, each job equals itself alone, and the 64x64 one, co-batched, equals diffusers' own
    pipeline. SDXL (a UNet: its key holds the size) runs the same jobs at one size."""
    is_packed = family.name != "sdxl"
    sizes = PACKED_SIZES if is_packed else [(64, 64)] * len(PACKED_SIZES)
    params_list = [
        family_params(
            family,
            prompt=prompt,
            seed=30 + index,
            num_inference_steps=num_steps,
            guidance_scale=guidance,
            negative_prompt=family.negative_prompt if index == 1 else "",
            height=height,
            width=width,
        )
        for index, (prompt, num_steps, guidance, (height, width)) in enumerate(
            zip(
                ("a red fox", "a blue bird over the sea", "snow", "a castle"),
                (6, 4, 5, 3),
                family.guidances,
                sizes,
            )
        )
    ]
    solo, batched = engines["solo"], engines["batched"]
    before = solo.stats()["tokens_computed"]
    alone = run_alone(solo, params_list)
    computed_alone = solo.stats()["tokens_computed"] - before
    before_stats = batched.stats()

    images = run_staggered(batched, params_list)

    stats = batched.stats()
    for params, image_alone, image in zip(params_list, alone, images):
        assert image.size == (params.width, params.height)
        assert max_pixel_diff(image_alone, image) <= 1, f"{params.width}x{params.height} job differs"
    sizes_per_forward = Counter(stats["sizes_per_forward"]) - Counter(before_stats["sizes_per_forward"])
    jobs_per_forward = Counter(stats["jobs_per_forward"]) - Counter(before_stats["jobs_per_forward"])
    assert max(sizes_per_forward if is_packed else jobs_per_forward) >= 3, (sizes_per_forward, jobs_per_forward)
    assert stats["tokens_padded"] == before_stats["tokens_padded"], "packed: no position is padding"
    assert stats["tokens_computed"] - before_stats["tokens_computed"] == computed_alone, "what the jobs compute alone"
    if family.text_tokens is not None:  # each row: its text tokens and its 16x16-pixel image patches, every step
        spec = params_list[0].family_spec
        assert computed_alone == sum(
            p.num_inference_steps
            * spec.num_rows(p.guidance_scale, p.negative_prompt)
            * (family.text_tokens + p.height * p.width // 256)
            for p in params_list
        )
    expected = own_pipeline_image(
        own_pipeline(family.model, family.pipeline_class), params_list[1], family.guidance_name
    )
    assert max_pixel_diff(images[1], expected) <= 2


MIXED_SIZES = [(64, 64), (96, 96), (64, 128), (128, 64)]  # the last two: equal token counts, transposed grids


def mixed_size_params(model: str, guidances: tuple[float, ...]) -> list[GenerationParams]:
    return [
        GenerationParams(
            prompt=f"a fox {index}",
            model=model,
            seed=index,
            num_inference_steps=3,
            guidance_scale=guidances[index],
            height=height,
            width=width,
        )
        for index, (height, width) in enumerate(MIXED_SIZES)
    ]


@pytest.mark.parametrize(
    "model, guidances", [("builtin:tiny-flux", (3.5, 1.0, 2.0, 5.0)), ("builtin:tiny-sd3", (7.0, 1.0, 2.0, 5.0))]
)
def test_deterministic_mode_keeps_sizes_apart_and_is_bit_identical_alone_and_batched(model, guidances):
    params_list = mixed_size_params(model, guidances)
    engine = DiffusionEngine(
        EngineConfig(model=model, device="cpu", max_num_seqs=4, max_num_groups=4, deterministic=True)
    )
    try:
        alone = run_alone(engine, params_list)
        engine.pause()
        futures = [engine.submit(params) for params in params_list]
        engine.resume()
        images = [future.result(timeout=120).image for future in futures]

        for image_alone, image in zip(alone, images):
            assert (pixels(image_alone) == pixels(image)).all()
        assert set(engine.stats()["sizes_per_forward"]) == {1}, "the size stays in the key"
    finally:
        engine.shutdown(abort=True)
