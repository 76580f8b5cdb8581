"""Input images through the API, in-process (create_app + test_client on a real Redis): uploads, data URIs,
tenant scoping, and a 4xx naming the field for every bad input image case."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

import core.image_inputs as image_inputs
from api import create_app
from api.settings import ApiSettings
from storage.settings import StorageSettings
from tests.support.app_context import get_task_queue_of, stored_params
from tests.support.calls import auth
from tests.support.pictures import JOB, data_uri, image_bytes, mask_uri
from tests.support.processes import TENANT_KEYS


def upload(client, data: bytes, tenant: str = "alice", content_type: str = "image/png"):
    return client.post("/v1/uploads", data=data, headers={**auth(tenant), "Content-Type": content_type})


def submit(client, body: dict, tenant: str = "alice"):
    return client.post("/v1/jobs", json=body, headers=auth(tenant))


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


def stored_upload_keys(app) -> list[str]:
    from api.resources import get_job_store

    with app.app_context():
        return list(get_job_store().redis.scan_iter("*:upload:*"))


def test_a_job_refused_after_its_images_were_checked_stores_no_image(app, client):
    refused_by_lora = submit(client, {**JOB, "init_image": data_uri(image_bytes()), "lora": "my-style"})
    batch = client.post(
        "/v1/jobs/batch",
        json={
            "jobs": [
                {**JOB, "init_image": data_uri(image_bytes(seed=1))},
                {**JOB, "lora": "my-style", "init_image": mask_uri()},
            ]
        },
        headers=auth(),
    )

    assert refused_by_lora.status_code == 422 and refused_by_lora.json["error"]["field"] == "lora"
    assert [item["status"] for item in batch.json["results"]] == [202, 422], batch.json
    assert len(stored_upload_keys(app)) == 1, "only the accepted batch item's image is stored"


@pytest.fixture
def one_job_app(redis_url, tmp_path):
    """The app with room for one queued job (STEPWISE_MAX_QUEUE_DEPTH=1), which its create script enforces."""
    settings = ApiSettings(
        api_keys=tuple(TENANT_KEYS.items()),
        storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()),
        accept_unserved_models=True,  # no worker: the first job stays queued
        max_queue_depth=1,
    )
    app = create_app({"TESTING": True, "API_SETTINGS": settings})
    yield app
    get_task_queue_of(app).close()


def test_a_conflicting_replayed_or_queue_full_create_stores_no_image(one_job_app):
    client = one_job_app.test_client()
    body = {**JOB, "init_image": data_uri(image_bytes())}
    first = client.post("/v1/jobs", json=body, headers={**auth(), "Idempotency-Key": "k1"})
    assert first.status_code == 202, first.json
    assert len(stored_upload_keys(one_job_app)) == 1

    replay = client.post("/v1/jobs", json=body, headers={**auth(), "Idempotency-Key": "k1"})
    changed = {**body, "init_image": data_uri(image_bytes(seed=2))}
    conflict = client.post("/v1/jobs", json=changed, headers={**auth(), "Idempotency-Key": "k1"})
    full = client.post("/v1/jobs", json=changed, headers=auth())

    assert replay.json["job_id"] == first.json["job_id"], replay.json
    assert conflict.status_code == 409, conflict.json
    assert full.status_code == 429 and full.json["error"]["code"] == "queue_full", full.json
    assert len(stored_upload_keys(one_job_app)) == 1, "only the accepted job's image is stored"


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


# Hostile and unusual images: every bad one gets a 4xx naming the field, odd-but-valid ones are accepted.


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(width: int, height: int) -> bytes:
    """A PNG of a few bytes whose header declares width x height pixels: a decompression bomb."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", zlib.compress(b"\x00" * 100))
        + png_chunk(b"IEND", b"")
    )


def jpeg_declaring(width: int, height: int) -> bytes:
    data = bytearray(image_bytes(16, 16, "JPEG"))
    start = data.index(b"\xff\xc0")  # the baseline frame header: length, precision, height, width
    data[start + 5 : start + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def png_with_chunk_before_pixels(kind: bytes, data: bytes) -> bytes:
    png = image_bytes()
    at = png.index(b"IDAT") - 4
    return png[:at] + png_chunk(kind, data) + png[at:]


def encoded(image: Image.Image, image_format: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    return buffer.getvalue()


METADATA_BOMB = zlib.compress(b"a" * 50_000_000, 9)  # 50 MB of text in 50 kB
HOSTILE_IMAGES = [  # (name, bytes, words of the message)
    ("png declaring 50000x50000", png_declaring(50_000, 50_000), "pixels"),
    ("png declaring 10000x10000", png_declaring(10_000, 10_000), "pixels"),  # Pillow only warns at this size
    ("png declaring 5000x5000", png_declaring(5000, 5000), "pixels"),
    ("jpeg declaring 60000x60000", jpeg_declaring(60_000, 60_000), "pixels"),
    ("png with a 50 MB zTXt chunk", png_with_chunk_before_pixels(b"zTXt", b"k\x00\x00" + METADATA_BOMB), "too large"),
    ("png with a 50 MB iCCP profile", png_with_chunk_before_pixels(b"iCCP", b"p\x00\x00" + METADATA_BOMB), "too large"),
    ("truncated png", image_bytes()[:6000], "truncated"),
    ("truncated jpeg", image_bytes(image_format="JPEG")[:1500], "truncated"),
    ("text", b"hello, not an image" * 10, "must be a PNG, JPEG or WebP"),
    ("GIF", image_bytes(image_format="GIF"), "(got 'GIF')"),
    ("TIFF", image_bytes(image_format="TIFF"), "(got 'TIFF')"),
    ("BMP", image_bytes(image_format="BMP"), "(got 'BMP')"),
    ("ICO", image_bytes(image_format="ICO"), "(got 'ICO')"),
]


@pytest.mark.parametrize("name, data, words", HOSTILE_IMAGES, ids=[case[0] for case in HOSTILE_IMAGES])
def test_a_hostile_or_unsupported_image_gets_422_naming_the_field_inline_and_as_an_upload(client, name, data, words):
    inline = submit(client, {**JOB, "init_image": data_uri(data)})
    as_mask = submit(client, {**JOB, "init_image": data_uri(image_bytes()), "mask_image": data_uri(data)})
    uploaded = upload(client, data)

    for response, field in ((inline, "init_image"), (as_mask, "mask_image"), (uploaded, "file")):
        assert response.status_code == 422, response.json
        assert response.json["error"]["field"] == field, response.json
        assert words in response.json["error"]["message"], response.json


def test_the_bytes_decide_the_format_not_the_content_type_or_media_type(client):
    jpeg = image_bytes(image_format="JPEG")

    as_text = upload(client, image_bytes(), content_type="text/plain")
    mislabelled = submit(client, {**JOB, "init_image": data_uri(jpeg, "image/png")})
    gif_label = submit(client, {**JOB, "init_image": data_uri(image_bytes(), "image/gif")})
    octet_stream = submit(client, {**JOB, "init_image": data_uri(image_bytes(), "application/octet-stream")})

    assert as_text.status_code == 201 and as_text.json["content_type"] == "image/png", as_text.json
    for response in (mislabelled, gif_label, octet_stream):
        assert response.status_code == 202, response.json


def test_a_multi_picture_camera_jpeg_is_accepted_as_a_jpeg(client):
    first, second = Image.new("RGB", (64, 64), "red"), Image.new("RGB", (64, 64), "blue")
    mpo = encoded(first, "MPO", save_all=True, append_images=[second])

    uploaded = upload(client, mpo, content_type="image/jpeg")
    response = submit(client, {**JOB, "init_image": data_uri(mpo, "image/jpeg")})

    assert uploaded.status_code == 201 and uploaded.json["content_type"] == "image/jpeg", uploaded.json
    assert response.status_code == 202, response.json


@pytest.mark.parametrize("image_format", ["WEBP", "PNG"])
def test_an_animated_webp_or_png_is_accepted(client, image_format):
    frames = [Image.new("RGB", (64, 64), color) for color in ("red", "green", "blue")]
    animated = encoded(frames[0], image_format, save_all=True, append_images=frames[1:])

    response = submit(client, {**JOB, "init_image": data_uri(animated, f"image/{image_format.lower()}")})

    assert response.status_code == 202, response.json


def test_a_rotated_jpeg_takes_the_size_viewers_show(client):
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: turn 90 degrees clockwise to show
    sideways = encoded(Image.new("RGB", (128, 64), "red"), "JPEG", exif=exif.tobytes())

    uploaded = upload(client, sideways, content_type="image/jpeg")
    response = submit(client, {**JOB, "init_image": uploaded.json["id"]})

    assert (uploaded.json["width"], uploaded.json["height"]) == (64, 128), uploaded.json
    assert response.status_code == 202, response.json
    assert (response.json["params"]["width"], response.json["params"]["height"]) == (64, 128)


ODD_IMAGES = [  # (name, image) each accepted as init image and as mask
    ("CMYK jpeg", encoded(Image.new("CMYK", (64, 64), (0, 255, 255, 0)), "JPEG")),
    ("16-bit gray png", encoded(Image.fromarray(np.full((64, 64), 40_000, np.uint16)))),
    ("palette png with transparency", encoded(Image.new("P", (64, 64), 1), transparency=1)),
    ("LA png", encoded(Image.new("LA", (64, 64), (255, 0)))),
    ("RGBA png", encoded(Image.new("RGBA", (64, 64), (255, 255, 255, 0)))),
    ("1-bit png", encoded(Image.new("1", (64, 64), 1))),
]


@pytest.mark.parametrize("name, data", ODD_IMAGES, ids=[case[0] for case in ODD_IMAGES])
def test_an_odd_but_valid_image_is_accepted_as_init_image_and_as_mask(client, name, data):
    response = submit(client, {**JOB, "init_image": data_uri(data), "mask_image": data_uri(data)})

    assert response.status_code == 202, response.json


def test_an_image_size_the_job_cannot_take_is_refused_naming_the_image_not_the_size(client):
    thin = submit(client, {**JOB, "init_image": data_uri(image_bytes(1, 600))})
    odd = submit(client, {**JOB, "init_image": data_uri(image_bytes(100, 75))})

    for response in (thin, odd):
        assert response.status_code == 422, response.json
        assert response.json["error"]["field"] == "init_image", response.json
        assert "resize_mode" in response.json["error"]["message"]


@pytest.mark.parametrize("resize_mode", ["stretch", "crop"])
def test_with_a_resize_mode_an_odd_image_size_is_rounded_down_as_diffusers_does(client, resize_mode):
    response = submit(client, {**JOB, "init_image": data_uri(image_bytes(100, 75)), "resize_mode": resize_mode})

    assert response.status_code == 202, response.json
    assert (response.json["params"]["width"], response.json["params"]["height"]) == (96, 72)


def test_base64_as_encoders_write_it_is_accepted(client):
    jpeg = next(data for seed in range(10) if len(data := image_bytes(image_format="JPEG", seed=seed)) % 3)  # padded
    text = base64.b64encode(jpeg).decode()
    variants = {
        "wrapped at 76 (base64 without -w0)": "\n".join(text[i : i + 76] for i in range(0, len(text), 76)),
        "CRLF-wrapped (MIME)": "\r\n".join(text[i : i + 76] for i in range(0, len(text), 76)),
        "URL-safe alphabet": base64.urlsafe_b64encode(jpeg).decode(),
        "no padding": text.rstrip("="),
    }

    for name, encoded_text in variants.items():
        response = submit(client, {**JOB, "init_image": f"data:image/jpeg;base64,{encoded_text}"})

        assert response.status_code == 202, (name, response.json)
        assert (response.json["params"]["width"], response.json["params"]["height"]) == (64, 64), name


def test_data_uri_parameters_are_ignored_and_a_uri_without_base64_is_refused(client):
    text = base64.b64encode(image_bytes()).decode()

    with_charset = submit(client, {**JOB, "init_image": f"data:image/png;charset=utf-8;base64,{text}"})
    with_name = submit(client, {**JOB, "init_image": f"DATA:IMAGE/PNG;name=photo.png;BASE64,{text}"})
    not_base64 = submit(client, {**JOB, "init_image": "data:image/png,%89PNG"})

    assert with_charset.status_code == with_name.status_code == 202, (with_charset.json, with_name.json)
    assert (with_name.json["params"]["width"], with_name.json["params"]["height"]) == (64, 64), "the image's size"
    assert not_base64.status_code == 422 and not_base64.json["error"]["field"] == "init_image"


@pytest.mark.parametrize(
    "filename", ["../../etc/passwd", "a\x00b.png", "x" * 5000 + ".png", "<script>.png", "evil\u202egnp.exe", ""]
)
def test_a_hostile_multipart_filename_is_ignored(client, filename):
    response = client.post(
        "/v1/uploads",
        headers=auth(),
        content_type="multipart/form-data",
        data={"file": (io.BytesIO(image_bytes()), filename)},
    )

    assert response.status_code == 201, response.json
    assert set(response.json) == {"id", "content_type", "width", "height", "bytes", "expires_in"}


def test_an_inline_image_in_an_unusual_form_is_stored_in_the_plain_form(app, client):
    from api.resources import get_upload_store

    png = image_bytes()
    text = base64.urlsafe_b64encode(png).decode().rstrip("=")
    sent = "data:application/octet-stream;name=x;base64," + "\n".join(text[i : i + 76] for i in range(0, len(text), 76))

    response = submit(client, {**JOB, "init_image": sent})

    assert response.status_code == 202, response.json
    upload_id = stored_params(app, response.json["job_id"])["init_image"]
    with app.app_context():
        assert get_upload_store().get("alice", upload_id) == data_uri(png, "image/png")
