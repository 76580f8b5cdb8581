"""OpenAI images request fields as stepwise reads them (api.openai_fields), without a server."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image
from werkzeug.datastructures import FileStorage, MultiDict

from api.errors import ApiError
from api.openai_fields import EXTENSIONS, IGNORED, TRANSLATED, edit_images, translate
from api.openapi_live import OpenAIImageEdit, OpenAIImageGeneration


def test_the_documented_fields_are_exactly_those_the_translation_accepts():
    accepted = TRANSLATED | IGNORED | set(EXTENSIONS)
    assert set(OpenAIImageGeneration.model_fields) == accepted
    assert set(OpenAIImageEdit.model_fields) == accepted | {"image", "mask"}


def test_openai_fields_become_a_job_and_unknown_ones_are_refused_as_openai_does():
    fields = {"prompt": "a fox", "n": "2", "size": "96x64", "output_compression": 0, "quality": "high", "seed": "5"}
    job = translate(fields, images={})  # multipart sends numbers as text

    assert job.job == {"prompt": "a fox", "num_images": 2, "width": 96, "height": 64, "output_quality": 1, "seed": 5}
    assert job.response_format == "b64_json"
    with pytest.raises(ApiError) as unknown:
        translate({"prompt": "a fox", "colour": "red"}, images={})
    assert unknown.value.field == "colour" and unknown.value.message == "Unrecognized request argument supplied: colour"
    for bad in ({"size": "64"}, {"stream": True}, {"background": "transparent"}, {"output_format": "gif"}):
        with pytest.raises(ApiError) as refused:
            translate({"prompt": "a fox", **bad}, images={})
        assert refused.value.field == next(iter(bad))


def png_part(image: Image.Image, name: str) -> FileStorage:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return FileStorage(io.BytesIO(buffer.getvalue()), filename=f"{name}.png", name=name, content_type="image/png")


def test_an_openai_mask_edits_where_it_is_transparent_so_it_becomes_white_there():
    mask = Image.new("RGBA", (8, 4), (10, 10, 10, 255))
    mask.paste((0, 0, 0, 0), (0, 0, 3, 4))  # transparent left 3 columns
    files = MultiDict({"image": png_part(Image.new("RGB", (8, 4), "blue"), "image"), "mask": png_part(mask, "mask")})

    images = edit_images(files)

    converted = Image.open(io.BytesIO(base64.b64decode(images["mask_image"].split(",", 1)[1])))
    assert (np.asarray(converted)[:, :3] == 255).all() and (np.asarray(converted)[:, 3:] == 0).all()
    assert images["init_image"].startswith("data:image/png;base64,")
    no_alpha_mask = png_part(Image.new("L", (8, 4)), "mask")
    opaque = MultiDict({"image": png_part(Image.new("RGB", (8, 4)), "image"), "mask": no_alpha_mask})
    with pytest.raises(ApiError) as no_alpha:
        edit_images(opaque)
    assert no_alpha.value.field == "mask"
