"""Several input images in one job (`reference_images`): FLUX.2's `image=[...]` and Qwen-Image-Edit-Plus.

Each image is read as the family's pipeline reads its list (its own size and resize rule, its own
latents and positions), so a two-image job equals diffusers' own pipeline given the same list; jobs
with different numbers of images (none included, where the family draws without one) share forwards,
their image tokens packed, and each equals itself alone. Invalid lists are refused naming the item.
"""

from __future__ import annotations

import pytest
from PIL import Image, ImageDraw

from batching import DiffusionEngine, EngineConfig, GenerationParams, InvalidParamsError
from tests.support.engines import max_pixel_diff, own_pipeline, own_pipeline_image, run_alone, run_staggered
from tests.support.pictures import init_picture, png_data_uri

FLUX2 = "builtin:tiny-flux2"
EDIT_PLUS = "builtin:tiny-qwen-image-edit-plus"


def picture(width: int, height: int, colour: tuple[int, int, int]) -> Image.Image:
    """The shared test picture at another size, with a coloured bar: each listed image differs from the others."""
    image = init_picture(max(width, height)).resize((width, height))
    ImageDraw.Draw(image).rectangle((0, height // 3, width - 1, height // 2), fill=colour)
    return image


PICTURES = [picture(80, 72, (250, 250, 0)), picture(64, 96, (0, 200, 90)), picture(96, 64, (200, 0, 200))]
URIS = [png_data_uri(image) for image in PICTURES]


def job_params(model: str, **overrides) -> GenerationParams:
    """A small job of `model`: 64x64 unless the overrides say (None: the images' size), a few steps."""
    values = dict(prompt="the fox in the room", model=model, seed=7, num_inference_steps=3, height=64, width=64)
    values.update(overrides)
    return GenerationParams(**values)


def flux2_params(**overrides) -> GenerationParams:
    return job_params(FLUX2, **{"num_inference_steps": 5, **overrides})


@pytest.fixture(scope="module")
def flux2_engine():
    engine = DiffusionEngine(EngineConfig(model=FLUX2, device="cpu", max_num_seqs=4, max_num_groups=1))
    yield engine
    engine.shutdown(abort=True)


def test_a_two_image_flux2_job_equals_diffusers_pipeline_given_the_same_list(flux2_engine):
    params = flux2_params(prompt="snow", seed=3, reference_images=URIS[:2], height=None, width=None)

    image = flux2_engine.submit(params).result(timeout=120).image

    pipeline = own_pipeline(FLUX2, "Flux2Pipeline")
    expected = own_pipeline_image(pipeline, params, image=PICTURES[:2])
    assert (params.width, params.height) == image.size == expected.size == (80, 64)  # the first image's, cropped
    assert max_pixel_diff(image, expected) <= 2
    one_image = own_pipeline_image(pipeline, params, image=PICTURES[:1])
    assert max_pixel_diff(image, one_image) > 3, "the second image changes the picture"


def assert_co_batched_jobs_equal_themselves_alone_packed(engine: DiffusionEngine, workload: list) -> None:
    """Each job alone, then all joining one after another: each equals itself alone within 1/255, some forward
    carried them all, and no position was padded."""
    alone = run_alone(engine, workload)
    before = engine.stats()

    together = run_staggered(engine, workload)

    for params, image_alone, image_together in zip(workload, alone, together):
        assert max_pixel_diff(image_alone, image_together) <= 1, params.prompt
    stats = engine.stats()
    assert max(stats["jobs_per_forward"]) == len(workload)
    assert stats["tokens_padded"] == before["tokens_padded"], "image tokens packed, not padded"


def test_flux2_jobs_with_zero_to_three_images_share_forwards_each_equal_to_itself_alone(flux2_engine):
    workload = [
        flux2_params(prompt="a red fox", seed=1, num_inference_steps=6),
        flux2_params(prompt="snow", seed=2, num_inference_steps=4, reference_images=URIS[:1], height=80),
        flux2_params(prompt="a calm lake", seed=3, num_inference_steps=4, reference_images=URIS[:2]),
        flux2_params(prompt="an old castle", seed=4, num_inference_steps=3, reference_images=URIS, width=96),
    ]

    assert_co_batched_jobs_equal_themselves_alone_packed(flux2_engine, workload)


def test_listed_images_count_in_what_a_job_costs_each_forward():
    from batching.sample import make_samples
    from core.families import FAMILIES
    from core.image_inputs import input_images

    params = flux2_params(reference_images=URIS[:2])  # a 64x64 job; references cropped to 80x64 and 64x96
    (sample,) = make_samples("job", params, FAMILIES["flux2"], images=input_images(params, "flux2"))

    assert sample.cost == 4 * 4 + 5 * 4 + 4 * 6  # tokens: 16-pixel patches


@pytest.mark.parametrize(
    "model, count, field",
    [(FLUX2, 11, "reference_images[10]"), (EDIT_PLUS, 4, "reference_images[3]")],
)
def test_more_images_than_the_family_takes_are_refused_naming_the_first_one_too_many(model, count, field):
    with pytest.raises(InvalidParamsError) as error:
        GenerationParams(prompt="a fox", model=model, reference_images=[URIS[0]] * count)

    assert error.value.field == field
    assert "at most" in str(error.value)


def test_an_item_that_is_no_image_reference_is_refused_naming_its_index():
    with pytest.raises(InvalidParamsError) as error:
        flux2_params(reference_images=[URIS[0], URIS[1], "not an image"])

    assert error.value.field == "reference_images[2]"
    assert "data:image" in str(error.value)


@pytest.mark.parametrize(
    "bad, why",
    [
        ("data:image/png;base64,QUJD", "PNG, JPEG or WebP"),  # no image's bytes
        (png_data_uri(Image.new("RGB", (48, 64))), "at least 64 pixels"),  # smaller than the pipeline takes
    ],
)
def test_an_item_that_cannot_be_read_is_refused_at_submit_naming_its_index(flux2_engine, bad, why):
    params = flux2_params(reference_images=[URIS[0], bad])

    with pytest.raises(InvalidParamsError) as error:
        flux2_engine.submit(params)

    assert error.value.field == "reference_images[1]"
    assert why in str(error.value)


@pytest.mark.parametrize("model", ["builtin:tiny-flux", "builtin:tiny-qwen-image-edit", "builtin:tiny"])
def test_a_family_that_takes_no_list_refuses_one_naming_the_field(model):
    with pytest.raises(InvalidParamsError) as error:
        GenerationParams(prompt="a fox", model=model, reference_images=[URIS[0]], height=64, width=64)

    assert error.value.field == "reference_images[0]"
    assert "not supported" in str(error.value)


def test_a_list_and_init_image_together_are_refused():
    with pytest.raises(InvalidParamsError) as error:
        flux2_params(init_image=URIS[0], reference_images=URIS[1:])

    assert error.value.field == "init_image"


def test_a_list_that_is_not_a_list_is_refused_naming_the_field():
    with pytest.raises(InvalidParamsError) as error:
        flux2_params(reference_images=URIS[0])

    assert error.value.field == "reference_images"


def test_init_image_is_the_one_image_form_of_the_list():
    from core.image_inputs import input_images

    as_init = flux2_params(init_image=URIS[0], height=None, width=None)
    as_list = flux2_params(reference_images=URIS[:1], height=None, width=None)

    assert (as_init.width, as_init.height) == (as_list.width, as_list.height) == (80, 64)
    init_images, list_images = input_images(as_init), input_images(as_list)
    assert init_images is not None and list_images is not None
    assert [image.tobytes() for image in init_images.listed] == [image.tobytes() for image in list_images.listed]


def edit_plus_params(**overrides) -> GenerationParams:
    return job_params(EDIT_PLUS, **{"seed": 5, **overrides})


@pytest.fixture(scope="module")
def edit_plus_engine():
    engine = DiffusionEngine(  # a budget that holds three jobs of up to three ~1024x1024-pixel images each
        EngineConfig(model=EDIT_PLUS, device="cpu", max_num_seqs=3, max_num_groups=1, max_num_tokens=80_000)
    )
    yield engine
    engine.shutdown(abort=True)


def test_a_two_image_edit_plus_job_equals_diffusers_pipeline_given_the_same_list(edit_plus_engine):
    import torch

    from batching.builtin_model import builtin_model_path
    from batching.pipelines.qwenimage.edit_plus import QwenImageEditPlusAdapter

    params = edit_plus_params(reference_images=URIS[:2], negative_prompt="blurry", height=None, width=None)
    image = edit_plus_engine.submit(params).result(timeout=300).image
    pipeline = QwenImageEditPlusAdapter.load_pipeline(
        EDIT_PLUS, str(builtin_model_path(EDIT_PLUS)), torch.device("cpu"), torch.float32
    )
    pipeline.set_progress_bar_config(disable=True)

    expected = own_pipeline_image(pipeline, params, "true_cfg_scale", image=PICTURES[:2])
    assert image.size == expected.size == (832, 1248)  # the last image's aspect ratio at about 1024x1024 pixels
    assert max_pixel_diff(image, expected) <= 2
    second_alone = own_pipeline_image(pipeline, params, "true_cfg_scale", image=PICTURES[1:2])
    assert max_pixel_diff(image, second_alone) > 3, "the first image changes the picture"


def test_edit_plus_jobs_with_one_to_three_images_share_forwards_each_equal_to_itself_alone(edit_plus_engine):
    workload = [
        edit_plus_params(seed=1, num_inference_steps=4, reference_images=URIS, negative_prompt="dark"),
        edit_plus_params(seed=2, init_image=URIS[2], height=80),
        edit_plus_params(seed=3, prompt="a fox", reference_images=URIS[1:]),
    ]

    assert_co_batched_jobs_equal_themselves_alone_packed(edit_plus_engine, workload)


def test_an_edit_plus_job_without_an_image_is_refused_naming_the_list():
    with pytest.raises(InvalidParamsError) as error:
        edit_plus_params()

    assert error.value.field == "reference_images"
    assert "1 to 3" in str(error.value)


def test_the_edit_plus_builtin_has_qwen_image_edit_2509_s_folder_layout_and_its_family_serves_it():
    import json

    from batching.builtin_model import builtin_model_path
    from batching.pipelines import adapter_serving

    folder = builtin_model_path(EDIT_PLUS)
    index = json.loads((folder / "model_index.json").read_text())

    assert index["_class_name"] == "QwenImageEditPlusPipeline"
    assert index["processor"] == ["transformers", "Qwen2VLProcessor"] and (folder / "processor").is_dir()
    assert {"scheduler", "text_encoder", "tokenizer", "transformer", "vae"} <= index.keys()
    assert adapter_serving(EDIT_PLUS, str(folder)).family == "qwenimage_edit_plus"
