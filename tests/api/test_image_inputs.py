"""Input images through the API, in-process (create_app + test_client on a real Redis): uploads, data URIs,
tenant scoping, and a 4xx naming the field for every bad input image case."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

import batching.image_inputs as image_inputs
from tests.api.calls import auth

JOB = {"prompt": "a red fox", "seed": 1, "num_inference_steps": 4}


def image_bytes(width: int = 64, height: int = 64, image_format: str = "PNG", seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=image_format)
    return buffer.getvalue()


def data_uri(data: bytes, content_type: str = "image/png") -> str:
    return f"data:{content_type};base64,{base64.b64encode(data).decode()}"


def mask_uri(width: int = 64, height: int = 64) -> str:
    buffer = io.BytesIO()
    Image.new("L", (width, height), 255).save(buffer, format="PNG")
    return data_uri(buffer.getvalue())


def upload(client, data: bytes, tenant: str = "alice", content_type: str = "image/png"):
    return client.post("/v1/uploads", data=data, headers={**auth(tenant), "Content-Type": content_type})


def submit(client, body: dict, tenant: str = "alice"):
    return client.post("/v1/jobs", json=body, headers=auth(tenant))


def stored_params(app, job_id: str) -> dict:
    from api.resources import get_job_store

    with app.app_context():
        return get_job_store().get(job_id).params


def test_an_uploaded_image_is_usable_by_id_and_the_record_keeps_only_the_id(app, client):
    created = upload(client, image_bytes(image_format="WEBP"), content_type="image/webp")
    assert created.status_code == 201, created.json
    assert created.json["content_type"] == "image/webp" and (created.json["width"], created.json["height"]) == (64, 64)

    response = submit(client, {**JOB, "init_image": created.json["id"], "strength": 0.5})

    assert response.status_code == 202, response.json
    assert stored_params(app, response.json["job_id"])["init_image"] == created.json["id"]
    assert (response.json["params"]["width"], response.json["params"]["height"]) == (64, 64), "the image's size"
    assert response.json["progress"]["total"] == 2, "half of 4 steps run"


def test_a_multipart_upload_works_too(client):
    response = client.post(
        "/v1/uploads",
        headers=auth(),
        content_type="multipart/form-data",
        data={"file": (io.BytesIO(image_bytes(image_format="JPEG")), "photo.jpg")},
    )

    assert response.status_code == 201, response.json
    assert response.json["content_type"] == "image/jpeg"


def test_a_data_uri_image_and_mask_are_stored_as_uploads_not_in_the_record(app, client):
    response = submit(client, {**JOB, "init_image": data_uri(image_bytes()), "mask_image": mask_uri()})

    assert response.status_code == 202, response.json
    params = stored_params(app, response.json["job_id"])
    assert image_inputs.is_upload_id(params["init_image"]) and image_inputs.is_upload_id(params["mask_image"])
    assert params["strength"] == 1.0, "an inpainting job repaints fully by default"


def test_another_tenant_cannot_use_an_upload_and_gets_the_missing_upload_answer(client):
    upload_id = upload(client, image_bytes(), tenant="alice").json["id"]

    as_bob = submit(client, {**JOB, "init_image": upload_id}, tenant="bob")
    missing = submit(client, {**JOB, "init_image": "upl_" + "0" * 32}, tenant="bob")

    assert as_bob.status_code == missing.status_code == 422
    assert as_bob.json["error"] == missing.json["error"]
    assert as_bob.json["error"]["field"] == "init_image"


BAD_CASES = [  # (name, job fields, field named)
    ("undecodable image", {"init_image": data_uri(b"\x89PNG\r\n\x1a\nnot really a png")}, "init_image"),
    ("not base64", {"init_image": "data:image/png;base64,@@@@"}, "init_image"),
    ("a GIF", {"init_image": data_uri(b"GIF89a" + b"\x00" * 40, "image/png")}, "init_image"),
    ("a remote URL", {"init_image": "https://127.0.0.1/cat.png"}, "init_image"),
    ("mask without init image", {"mask_image": mask_uri()}, "mask_image"),
    ("mask of another size", {"init_image": data_uri(image_bytes()), "mask_image": mask_uri(32, 32)}, "mask_image"),
    ("image size differs from the job's", {"init_image": data_uri(image_bytes()), "width": 128}, "init_image"),
    ("strength 0", {"init_image": data_uri(image_bytes()), "strength": 0}, "strength"),
    ("strength above 1", {"init_image": data_uri(image_bytes()), "strength": 1.5}, "strength"),
    ("strength that runs no step", {"init_image": data_uri(image_bytes()), "strength": 0.1}, "strength"),
    ("strength without an image", {"strength": 0.5}, "strength"),
    ("unknown resize mode", {"init_image": data_uri(image_bytes()), "resize_mode": "pad"}, "resize_mode"),
    ("unknown output format", {"output_format": "gif"}, "output_format"),
    ("output quality 0", {"output_format": "jpeg", "output_quality": 0}, "output_quality"),
]


@pytest.mark.parametrize("name, fields, field", BAD_CASES, ids=[case[0] for case in BAD_CASES])
def test_a_bad_image_input_gets_422_naming_the_field(client, name, fields, field):
    response = submit(client, {**JOB, **fields})

    assert response.status_code == 422, response.json
    assert response.json["error"]["field"] == field, response.json


def test_images_over_the_byte_or_pixel_limit_are_refused_naming_the_field(client, monkeypatch):
    small = image_bytes(64, 64)  # limits lowered below it: the real ones need bodies of megabytes
    monkeypatch.setattr(image_inputs, "MAX_IMAGE_BYTES", len(small) - 1)
    too_many_bytes = submit(client, {**JOB, "init_image": data_uri(small)})
    monkeypatch.setattr(image_inputs, "MAX_IMAGE_BYTES", 10**7)
    monkeypatch.setattr(image_inputs, "MAX_IMAGE_PIXELS", 64 * 64 - 1)
    too_many_pixels = submit(client, {**JOB, "init_image": data_uri(small)})
    upload_too_large = upload(client, small)  # over the pixel limit

    for response in (too_many_bytes, too_many_pixels):
        assert response.status_code == 422 and response.json["error"]["field"] == "init_image", response.json
    assert upload_too_large.status_code == 422 and upload_too_large.json["error"]["field"] == "file"


def test_a_resize_mode_fits_an_image_of_another_size(client):
    response = submit(
        client, {**JOB, "init_image": data_uri(image_bytes(80, 64)), "width": 64, "height": 64, "resize_mode": "crop"}
    )

    assert response.status_code == 202, response.json


def test_an_upload_that_is_not_an_image_is_refused_naming_the_file(client):
    response = upload(client, b"hello, not an image", content_type="image/png")

    assert response.status_code == 422 and response.json["error"]["field"] == "file"
