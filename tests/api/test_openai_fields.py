"""OpenAI images request fields as stepwise reads them (api.openai_fields) and documents them, without a server."""

from __future__ import annotations

import base64
import io

import jsonschema
import numpy as np
import pytest
from PIL import Image
from werkzeug.datastructures import FileStorage, MultiDict

from api import create_app
from api.errors import ApiError
from api.openai_fields import edit_images, translate
from api.settings import ApiSettings
from storage.settings import StorageSettings
from tests.support.calls import auth
from tests.support.processes import TENANT_KEYS


def test_openai_fields_become_a_job_and_unknown_ones_are_refused_as_openai_does():
    form = {"prompt": "a fox", "n": "2", "size": "96x64", "output_compression": "0", "quality": "high", "seed": "5"}
    job = translate(form, images={}, is_form=True)  # multipart sends numbers as text

    assert job.job == {"prompt": "a fox", "num_images": 2, "width": 96, "height": 64, "output_quality": 1, "seed": 5}
    assert job.response_format == "b64_json"
    with pytest.raises(ApiError) as as_text:
        translate({"prompt": "a fox", "n": "2"}, images={})  # JSON has numbers: "2" is no integer there
    assert as_text.value.field == "n"
    with pytest.raises(ApiError) as unknown:
        translate({"prompt": "a fox", "colour": "red"}, images={})
    assert unknown.value.field == "colour" and unknown.value.message == "Unrecognized request argument supplied: colour"
    for bad in ({"size": "64"}, {"stream": True}, {"background": "transparent"}, {"output_format": "gif"}):
        with pytest.raises(ApiError) as refused:
            translate({"prompt": "a fox", **bad}, images={})
        assert refused.value.field == next(iter(bad))


# What a probe found the route and the document disagreeing on (issue 35), and neighbours of each.
PROBED = [
    pytest.param({"negative_prompt": "no\x00pe"}, "negative_prompt", id="NUL in negative_prompt"),
    pytest.param({"output_compression": -1}, "output_compression", id="output_compression -1"),
    pytest.param({"output_compression": 101}, "output_compression", id="output_compression 101"),
    pytest.param({"size": "\uff11\uff12\uff18x128"}, "size", id="full-width digits in size"),
    pytest.param({"response_format": ""}, "response_format", id="empty response_format"),
    pytest.param({"prompt": "a fox\x00"}, "prompt", id="NUL in prompt"),
    pytest.param({"model": "builtin:\x01tiny"}, "model", id="control character in model"),
]


@pytest.fixture(scope="module")
def generation_schema(redis_server, tmp_path_factory) -> jsonschema.Draft202012Validator:
    settings = ApiSettings(
        api_keys=tuple(TENANT_KEYS.items()),
        storage=StorageSettings(redis_url=redis_server.url, storage_url=tmp_path_factory.mktemp("i").as_uri()),
    )
    document = create_app({"TESTING": True, "API_SETTINGS": settings}).test_client().get("/openapi.json").json
    schema = {"$ref": "#/components/schemas/OpenAIImageGeneration", "components": document["components"]}
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize(("fields", "param"), PROBED)
def test_what_the_document_forbids_the_generations_route_refuses_naming_the_param(
    client, generation_schema, fields, param
):
    body = {"prompt": "a fox", "model": "builtin:tiny", **fields}

    response = client.post("/v1/images/generations", json=body, headers=auth())

    assert not generation_schema.is_valid(body)
    assert response.status_code == (404 if param == "model" else 400), response.json  # OpenAI: 404 for a model
    assert response.json["error"]["param"] == param and response.json["error"]["type"] == "invalid_request_error"


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
