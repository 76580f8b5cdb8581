"""POST /v1/videos as clients send it, without a worker (the app in this process on a real Redis): the first frame
as a multipart file or a JSON reference, seconds as frames, and the refusals that name the parameter."""

from __future__ import annotations

import io

import pytest

from tests.support.calls import auth
from tests.support.pictures import data_uri, image_bytes

I2V = "builtin:tiny-wan-i2v"


def job_params(client, video_id: str) -> dict:
    return client.get(f"/v1/jobs/{video_id}", headers=auth()).get_json()["params"]


def test_a_multipart_input_reference_becomes_the_jobs_first_frame_cropped_to_the_size(client):
    form = {"prompt": "a fox", "model": I2V, "size": "64x64", "seconds": "1", "fps": "8"}
    form["input_reference"] = (io.BytesIO(image_bytes(96, 64)), "frame.png", "image/png")

    response = client.post("/v1/videos", data=form, headers=auth(), content_type="multipart/form-data")

    assert response.status_code == 200, response.get_json()
    video = response.get_json()
    params = job_params(client, video["id"])
    assert (video["status"], video["num_frames"], video["fps"], video["seconds"]) == ("queued", 9, 8, "1")
    assert params["init_image"].startswith("upl_") and params["resize_mode"] == "crop"
    assert params["output_format"] == "mp4"


@pytest.mark.parametrize("reference", [lambda uri: uri, lambda uri: {"image_url": uri}], ids=["string", "image_url"])
def test_a_json_input_reference_is_taken_as_a_data_uri_or_openai_s_image_url_object(client, reference):
    body = {"prompt": "a fox", "model": I2V, "input_reference": reference(data_uri(image_bytes(64, 64)))}

    response = client.post("/v1/videos", json=body, headers=auth())

    assert response.status_code == 200, response.get_json()
    assert job_params(client, response.get_json()["id"])["init_image"].startswith("upl_")


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param"),
    [
        ("POST", "/v1/videos", {"prompt": "a", "model": I2V, "seconds": 2, "num_frames": 9}, 400, "seconds"),
        ("POST", "/v1/videos", {"prompt": "a", "model": I2V, "input_reference": {"url": "x"}}, 400, "input_reference"),
        (
            "POST",
            "/v1/videos",
            {"prompt": "a", "model": I2V, "input_reference": "data:image/png;base64,AA=="},
            400,
            "input_reference",
        ),
        ("GET", "/v1/videos?after=" + "0" * 32, None, 404, "after"),
        ("GET", "/v1/videos?order=asc", None, 400, "order"),
    ],
)
def test_invalid_video_requests_are_refused_in_openai_s_shape_naming_the_param(
    client, method, path, body, status, param
):
    response = client.open(path, method=method, json=body, headers=auth())

    assert response.status_code == status, response.get_json()
    assert response.get_json()["error"]["param"] == param


def test_an_image_job_is_not_a_video_and_a_video_s_content_waits_for_it_to_complete(client):
    image_job = client.post("/v1/jobs", json={"prompt": "a fox", "model": "builtin:tiny"}, headers=auth()).get_json()
    video = client.post("/v1/videos", json={"prompt": "a fox", "model": "builtin:tiny-wan"}, headers=auth()).get_json()

    assert client.get(f"/v1/videos/{image_job['job_id']}", headers=auth()).status_code == 404
    assert [item["id"] for item in client.get("/v1/videos", headers=auth()).get_json()["data"]] == [video["id"]]
    content = client.get(f"/v1/videos/{video['id']}/content", headers=auth())
    assert (content.status_code, content.get_json()["error"]["code"]) == (409, "video_not_ready")
    thumbnail = client.get(f"/v1/videos/{video['id']}/content?variant=thumbnail", headers=auth())
    assert (thumbnail.status_code, thumbnail.get_json()["error"]["param"]) == (400, "variant")


def test_a_replayed_idempotency_key_answers_the_original_video_and_another_body_409(client):
    body = {"prompt": "a fox", "model": "builtin:tiny-wan", "seed": 3}
    key = {**auth(), "Idempotency-Key": "video-1"}

    first = client.post("/v1/videos", json=body, headers=key)
    again = client.post("/v1/videos", json=body, headers=key)
    other = client.post("/v1/videos", json={**body, "seed": 4}, headers=key)

    assert again.get_json()["id"] == first.get_json()["id"]
    assert len(client.get("/v1/videos", headers=auth()).get_json()["data"]) == 1
    assert other.status_code == 409
