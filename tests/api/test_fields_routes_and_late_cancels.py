"""What the hardening probe found at submit and cancel (issue 48 E5-E8), in process (Flask's test client, real
Redis): a field the model cannot use is refused naming it (it used to fail at the worker); the images routes
refuse a video model (they answered an MP4 in `b64_json`); a cancel that cannot be honoured answers 409 (it
answered 202 and the job then succeeded); `/v1/videos` reads `seconds` as one number named `seconds` (it took
"0" but not 0, and named `seconds.constrained-float`)."""

from __future__ import annotations

import io
import time

import pytest

from core.families import FAMILIES
from storage.heartbeats import Heartbeat
from storage.job_store import JobStore
from storage.queue_names import generate_queue
from tests.support.calls import auth
from tests.support.job_factories import take_job
from tests.support.pictures import data_uri, image_bytes
from worker.heartbeat import family_limits

WAN = "builtin:tiny-wan"  # text-to-video, one expert
WAN22 = "builtin:tiny-wan22"  # text-to-video, two experts


def beat(client, model: str, unusable_fields: list[str]) -> None:
    """What a worker serving `model` writes (worker.heartbeat.current_heartbeat): its family's limits, and the
    family's fields this model cannot use, as its engine names them (tests/batching/test_wan.py)."""
    store = client.application.extensions["stepwise.job_store"]
    limits = {**family_limits("wan"), "needs_init_image": False, "unusable_fields": unusable_fields}
    store.beat(Heartbeat(f"worker-{model}", model, generate_queue(model), "wan", 4, time.time(), limits=limits))


def queued(redis_url: str) -> int:
    with JobStore(redis_url) as store:
        return store.queue_depth()


# the route, and what it calls the first frame (OpenAI's input_reference is the job's init_image)
@pytest.mark.parametrize(("path", "first_frame"), [("/v1/jobs", "init_image"), ("/v1/videos", "input_reference")])
def test_a_field_the_model_cannot_use_is_refused_at_submit_naming_it(client, redis_url, path, first_frame):
    beat(client, WAN, ["guidance_scale_2", "init_image"])
    beat(client, WAN22, ["init_image"])
    body = {"prompt": "a fox", "guidance_scale_2": 3.0}

    one_expert = client.post(path, json={**body, "model": WAN}, headers=auth())
    two_experts = client.post(path, json={**body, "model": WAN22}, headers=auth())
    with_frame = client.post(
        path, json={"prompt": "a fox", "model": WAN22, first_frame: data_uri(image_bytes())}, headers=auth()
    )

    error = one_expert.get_json()["error"]
    assert one_expert.status_code in (400, 422) and error.get("field", error.get("param")) == "guidance_scale_2"
    assert "only two-expert models (Wan 2.2 A14B" in error["message"]
    assert two_experts.status_code in (200, 202), two_experts.get_json()
    error = with_frame.get_json()["error"]
    assert error.get("field", error.get("param")) == first_frame and "only image-to-video models" in error["message"]
    assert queued(redis_url) == 1  # only the two-expert job
    assert set(FAMILIES["wan"].model_fields) == {"guidance_scale_2", "init_image"}


@pytest.mark.parametrize("model", [WAN, "builtin:tiny-wan-i2v"])
def test_the_images_routes_refuse_a_video_model_pointing_at_v1_videos(client, redis_url, model):
    generation = client.post("/v1/images/generations", json={"prompt": "a fox", "model": model}, headers=auth())
    edit = client.post(
        "/v1/images/edits",
        data={"prompt": "a fox", "model": model, "image": (io.BytesIO(image_bytes()), "in.png", "image/png")},
        headers=auth(),
        content_type="multipart/form-data",
    )

    for response in (generation, edit):
        error = response.get_json()["error"]
        assert response.status_code == 400, error
        assert (error["param"], error["code"]) == ("model", "model_not_image")
        assert "POST /v1/videos" in error["message"]
    assert queued(redis_url) == 0


@pytest.mark.parametrize("seconds", [0, "0", 0.0, "0.0", -1, 601, "601", "1e3", "four", True])
def test_video_seconds_are_one_number_and_every_refusal_names_seconds(client, seconds):
    body = {"prompt": "a fox", "model": WAN, "seconds": seconds}

    response = client.post("/v1/videos", json=body, headers=auth())

    error = response.get_json()["error"]
    assert response.status_code == 400 and error["param"] == "seconds", error


def test_zero_seconds_as_text_and_as_a_number_get_the_same_answer(client):
    answers = [
        client.post("/v1/videos", json={"prompt": "a fox", "model": WAN, "seconds": value}, headers=auth()).get_json()
        for value in ("0", 0)
    ]

    assert answers[0] == answers[1]
    assert answers[0]["error"]["message"] == "seconds: Input should be greater than 0"


def test_a_cancel_that_comes_after_the_images_are_made_answers_409_saying_why(client, redis_url):
    job_id = client.post("/v1/jobs", json={"prompt": "a fox"}, headers=auth()).get_json()["job_id"]
    with JobStore(redis_url) as store:
        holder = take_job(store, job_id, "worker-1", 60).holder
        store.set_progress(job_id, 20, 20)
        assert store.set_storing(job_id, holder, "S3 upload of s3://b/x/0.png failed after 5 attempts")

        response = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth())

        record = store.get(job_id)
    error = response.get_json()["error"]
    assert response.status_code == 409 and error["code"] == "job_storing", error
    assert "wait in its worker's spool" in error["message"] and "succeeds once they are stored" in error["message"]
    assert record.state.value == "running" and not record.cancel_requested


def test_a_cancel_of_a_running_job_still_asks_it_to_stop(client, redis_url):
    job_id = client.post("/v1/jobs", json={"prompt": "a fox"}, headers=auth()).get_json()["job_id"]
    with JobStore(redis_url) as store:
        take_job(store, job_id, "worker-1", 60)

        response = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth())

        assert response.status_code == 202 and store.get(job_id).cancel_requested
