"""A job for a model family gets a 422 naming the field when it asks what the family cannot do."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from api.errors import ApiError
from api.fleet import Fleet
from api.settings import ApiSettings
from api.submission import validate_job
from core.image_inputs import to_data_uri
from storage.job_store import JobStore
from storage.settings import StorageSettings


@pytest.fixture
def validate(redis_url):
    """validate_job as a submit runs it, with jobs for models no worker serves yet accepted."""
    settings = ApiSettings(api_keys=(), storage=StorageSettings(redis_url=redis_url), accept_unserved_models=True)
    store = JobStore.from_settings(settings.storage)
    yield lambda data: validate_job(data, settings, Fleet(store, settings), "local")
    store.close()


@pytest.mark.parametrize(
    "field, value", [("sampler", "dpmpp_2m"), ("width", 200), ("guidance_scale", 30.0), ("negative_prompt", "blurry")]
)
def test_a_flux_job_the_family_cannot_run_gets_422_naming_the_field(validate, field, value):
    with pytest.raises(ApiError) as error:
        validate({"prompt": "a fox", "model": "builtin:tiny-flux", field: value})

    assert (error.value.status, error.value.field) == (422, field)


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_frames", 8),  # 4k+1
        ("num_frames", 165),  # over 161
        ("fps", 0),
        ("fps", 121),
        ("output_format", "png"),  # an image format, for a video of 33 frames
        ("output_format", "mov"),
        ("sampler", "ddim"),
    ],
)
def test_a_wan_job_the_family_cannot_run_gets_422_naming_the_field(validate, field, value):
    with pytest.raises(ApiError) as error:
        validate({"prompt": "a fox", "model": "builtin:tiny-wan", field: value})

    assert (error.value.status, error.value.field) == (422, field)


def test_a_wan_job_gets_the_family_video_defaults_and_a_one_frame_one_may_be_an_image(validate):
    video = validate({"prompt": "a fox", "model": "builtin:tiny-wan"}).params
    image = validate({"prompt": "a fox", "model": "builtin:tiny-wan", "num_frames": 1, "output_format": "webp"}).params

    assert (video.num_frames, video.fps, video.sampler, video.output_format) == (33, 16, "unipc", "mp4")
    assert (image.num_frames, image.output_format) == (1, "webp")


@pytest.mark.parametrize(
    "model",
    [
        "builtin:tiny-zimage",
        "builtin:tiny-sd3",
        "builtin:tiny-flux2",
        "builtin:tiny-flux2-klein",
        "builtin:tiny-qwen-image",
        "builtin:tiny-wan",
    ],
)
@pytest.mark.parametrize("cache", ["off", "fast", "balanced", 0.05])
def test_a_cache_setting_reaches_the_job_params_on_every_transformer_family(validate, model, cache):
    job = validate({"prompt": "a fox", "model": model, "cache": cache})

    assert job.params.cache == cache


def test_a_flux_job_without_size_or_guidance_gets_the_family_defaults(validate):
    job = validate({"prompt": "a fox", "model": "builtin:tiny-flux"})

    assert (job.params.guidance_scale, job.params.sampler, job.params.width % 16) == (3.5, "euler", 0)


@pytest.mark.parametrize("field, value", [("sampler", "ddim"), ("height", 72), ("guidance_scale", 51.0)])
def test_an_sd3_job_the_family_cannot_run_gets_422_naming_the_field(validate, field, value):
    with pytest.raises(ApiError) as error:
        validate({"prompt": "a fox", "model": "builtin:tiny-sd3", field: value})

    assert (error.value.status, error.value.field) == (422, field)


def test_an_sd3_job_takes_a_negative_prompt_and_the_family_defaults(validate):
    job = validate({"prompt": "a fox", "model": "builtin:tiny-sd3", "negative_prompt": "blurry"})

    assert (job.params.guidance_scale, job.params.sampler, job.params.negative_prompt) == (7.0, "euler", "blurry")


@pytest.mark.parametrize(
    "model, field, value",
    [
        ("builtin:tiny-qwen-image", "sampler", "ddim"),
        ("builtin:tiny-qwen-image", "width", 72),
        ("builtin:tiny-qwen-image-edit", "init_image", None),  # an edit job without the image to edit
        ("builtin:tiny-qwen-image-edit", "height", 72),
    ],
)
def test_a_qwen_image_job_the_family_cannot_run_gets_422_naming_the_field(validate, model, field, value):
    with pytest.raises(ApiError) as error:
        validate({"prompt": "a fox", "model": model, **({field: value} if value is not None else {})})

    assert (error.value.status, error.value.field) == (422, field)


def test_a_qwen_image_job_without_guidance_gets_the_true_cfg_default_of_its_pipeline(validate):
    job = validate({"prompt": "a fox", "model": "builtin:tiny-qwen-image", "negative_prompt": "blurry"})

    assert (job.params.guidance_scale, job.params.sampler, job.params.negative_prompt) == (4.0, "euler", "blurry")


def picture_uri(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 80, 40)).save(buffer, format="PNG")
    return to_data_uri(buffer.getvalue(), "image/png")


def test_a_flux2_job_with_a_reference_image_refuses_start_image_fields_and_unusable_references(validate):
    reference = picture_uri(64, 64)
    for field, value in (("mask_image", reference), ("resize_mode", "stretch")):
        with pytest.raises(ApiError) as error:
            validate({"prompt": "a fox", "model": "builtin:tiny-flux2", "init_image": reference, field: value})
        assert (error.value.status, error.value.field) == (422, field)
    with pytest.raises(ApiError) as error:  # under the pipeline's 64 pixels a side
        validate({"prompt": "a fox", "model": "builtin:tiny-flux2", "init_image": picture_uri(48, 64)})
    assert (error.value.status, error.value.field) == (422, "init_image")

    job = validate({"prompt": "a fox", "model": "builtin:tiny-flux2", "init_image": picture_uri(72, 100)})
    assert (job.params.width, job.params.height, job.params.strength) == (64, 96, 1.0)  # its size, cropped to 16s


def test_an_edit_job_takes_an_image_of_any_size_and_without_a_size_gets_its_pipeline_s_size_for_it(validate):
    job = {"prompt": "make it red", "model": "builtin:tiny-qwen-image-edit", "init_image": picture_uri(64, 48)}
    sized = validate({**job, "width": 64, "height": 64})
    with pytest.raises(ApiError) as unsized:
        validate(job)

    assert (sized.params.width, sized.params.height, sized.params.strength) == (64, 64, 1.0)
    assert unsized.value.field == "height"
    assert "1060864" in unsized.value.message, "1184x896 (4:3 at about 1024x1024): over a CPU worker's max_pixels"
