"""`reference_images` through `POST /v1/jobs` (in process, on a real Redis): every form init_image takes, kept as
uploads in the record, and a 422 naming the item for each invalid list."""

from __future__ import annotations

import pytest

from core.image_inputs import is_upload_id
from tests.support.app_context import stored_params
from tests.support.calls import auth
from tests.support.pictures import JOB, data_uri, image_bytes

FLUX2 = "builtin:tiny-flux2"
EDIT_PLUS = "builtin:tiny-qwen-image-edit-plus"


def submit(client, body: dict):
    return client.post("/v1/jobs", json=body, headers=auth())


def test_a_list_of_an_upload_and_data_uris_is_kept_as_uploads_in_order(app, client):
    uploaded = client.post(
        "/v1/uploads", data=image_bytes(96, 64, seed=1), headers={**auth(), "Content-Type": "image/png"}
    )
    listed = [data_uri(image_bytes(64, 80, seed=2)), uploaded.json["id"], data_uri(image_bytes(112, 64, seed=3))]

    response = submit(client, {**JOB, "model": EDIT_PLUS, "reference_images": listed, "height": 64, "width": 96})

    assert response.status_code == 202, response.json
    stored = stored_params(app, response.json["job_id"])["reference_images"]
    assert len(stored) == 3 and all(is_upload_id(upload_id) for upload_id in stored)
    assert stored[1] == uploaded.json["id"], "an upload sent by id is kept as it is"


@pytest.mark.parametrize(
    "model, listed, field, words",
    [
        (EDIT_PLUS, [data_uri(image_bytes())] * 4, "reference_images[3]", "at most 3"),
        (FLUX2, [data_uri(image_bytes())] * 11, "reference_images[10]", "at most 10"),
        (FLUX2, [data_uri(image_bytes()), "upl_" + "0" * 32], "reference_images[1]", "no upload of yours"),
        (FLUX2, [data_uri(image_bytes()), data_uri(b"GIF89a" + b"\0" * 20)], "reference_images[1]", "PNG, JPEG"),
        (FLUX2, [data_uri(image_bytes()), 7], "reference_images[1]", "string"),
        (FLUX2, [data_uri(image_bytes()), data_uri(image_bytes(48, 64))], "reference_images[1]", "at least 64"),
        ("builtin:tiny", [data_uri(image_bytes())], "reference_images[0]", "not supported by sd models"),
        (EDIT_PLUS, [], "reference_images", "1 to 3 images"),
    ],
)
def test_an_invalid_list_is_refused_naming_the_field_and_the_item(client, model, listed, field, words):
    response = submit(client, {**JOB, "model": model, "reference_images": listed})

    assert response.status_code == 422, response.json
    assert response.json["error"]["field"] == field
    assert words in response.json["error"]["message"]
