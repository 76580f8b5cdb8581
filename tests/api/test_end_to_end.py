"""End to end over real HTTP: `stepwise api`, a real Celery worker with the built-in tiny model,
real Redis, local image storage, and a webhook receiver started by the test."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import io
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from celery import Celery
from PIL import Image

from tests.support.calls import auth, get_job, submit, wait_for_job
from tests.support.processes import WEBHOOK_SECRET, WorkerProcess
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import Delivery, WebhookReceiver

pytestmark = pytest.mark.workers

SMALL = {
    "prompt": "a red fox in snow",
    "seed": 7,
    "num_inference_steps": 4,
    "height": 64,
    "width": 96,
    "guidance_scale": 1.0,
}
SLOW = {"prompt": "a long walk", "seed": 3, "num_inference_steps": 200, "height": 256, "width": 256}


@pytest.fixture
def receiver():
    with WebhookReceiver() as server:
        yield server


@contextlib.contextmanager
def generation_paused(worker: WorkerProcess, redis_url: str):
    """The worker takes no job inside the block (`celery control drain`, then `resume`)."""
    control = Celery(broker=redis_url, set_as_current=False).control
    control.broadcast("drain", destination=[worker.name], reply=True, timeout=10)
    try:
        yield
    finally:
        control.broadcast("resume", destination=[worker.name], reply=True, timeout=10)


def verify_signature(delivery: Delivery) -> None:
    """Standard Webhooks, computed here independently of the project's own helper."""
    key = base64.b64decode(WEBHOOK_SECRET.removeprefix("whsec_"))
    headers = delivery.headers
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + delivery.body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert expected in headers["webhook-signature"].split(), headers
    assert abs(time.time() - int(headers["webhook-timestamp"])) < 300


def test_a_submitted_job_succeeds_and_its_image_is_a_png_of_the_requested_size(api, worker, http):
    job = submit(http, api, SMALL).json()

    done = wait_for_job(http, api, job["job_id"], {"succeeded"})
    image = http.get(done["image_url"], headers=auth(), timeout=30)

    assert done["image_url"] == f"{api.url}/v1/jobs/{job['job_id']}/image"
    assert done["progress"]["step"] == done["progress"]["total"] > 0
    created, started, finished = (
        datetime.fromisoformat(done[name]) for name in ("created_at", "started_at", "finished_at")
    )
    assert created <= started <= finished
    span = (finished - created).total_seconds()  # the view's times are in milliseconds
    timings = done["timings"]  # the parts of a job's life in seconds, within accepted..finished (docs/api.md)
    assert 0 < timings["queue_wait"] < timings["total"] <= span + 0.002
    assert 0 < timings["engine"] < timings["total"] and 0 < timings["encode"] <= timings["upload"]
    assert image.status_code == 200 and image.headers["Content-Type"] == "image/png"
    assert image.content.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(image.content)) as png:
        png.verify()
    with Image.open(io.BytesIO(image.content)) as png:
        assert png.size == (SMALL["width"], SMALL["height"])


def test_a_multi_image_job_has_one_image_per_seed(api, worker, http):
    job = submit(http, api, {**SMALL, "num_images": 2}).json()

    done = wait_for_job(http, api, job["job_id"], {"succeeded"})
    images = [http.get(url, headers=auth(), timeout=30) for url in done["image_urls"]]

    assert len(images) == 2 and all(image.status_code == 200 for image in images)
    assert images[0].content != images[1].content
    assert http.get(f"{done['status_url']}/image", params={"index": 2}, headers=auth(), timeout=10).status_code == 404


def test_the_receiver_gets_started_and_completed_events_signed_with_the_secret(api, worker, http, receiver):
    job = submit(http, api, {**SMALL, "webhook_url": receiver.url("/hooks/signed")}).json()
    wait_for_job(http, api, job["job_id"], {"succeeded"})

    deliveries = receiver.wait_for("/hooks/signed", lambda got: len(got) >= 2)

    assert sorted(d.payload["type"] for d in deliveries) == ["job.completed", "job.started"]
    assert all(d.payload["data"]["job_id"] == job["job_id"] for d in deliveries)
    for delivery in deliveries:
        verify_signature(delivery)
    assert len({d.headers["webhook-id"] for d in deliveries}) == 2


def test_a_receiver_that_fails_twice_gets_the_event_on_the_third_attempt_with_the_same_id(api, worker, http, receiver):
    path = "/hooks/fail-2"
    job = submit(http, api, {**SMALL, "webhook_url": receiver.url(path), "webhook_events": ["completed"]}).json()
    wait_for_job(http, api, job["job_id"], {"succeeded"})

    deliveries = receiver.wait_for(path, lambda got: any(d.status == 204 for d in got))

    assert [d.status for d in deliveries] == [500, 500, 204]
    assert len({d.headers["webhook-id"] for d in deliveries}) == 1
    assert len({d.body for d in deliveries}) == 1
    for delivery in deliveries:
        verify_signature(delivery)
    attempts = wait_until_attempts(http, api, job["job_id"], 3)
    assert [(a["attempt"], a["delivered"]) for a in attempts] == [(1, False), (2, False), (3, True)]


def wait_until_attempts(http, api, job_id: str, count: int, timeout: float = 20.0) -> list[dict]:
    def recorded() -> list[dict] | None:
        attempts = get_job(http, api, job_id).json()["webhook"]["attempts"]
        return attempts if len(attempts) >= count else None

    return wait_for(
        recorded, timeout, lambda: f"{count} webhook attempts: {get_job(http, api, job_id).json()['webhook']}"
    )


def test_canceling_a_running_job_stops_it_at_a_step_boundary(api, worker, http, receiver):
    job = submit(http, api, {**SLOW, "webhook_url": receiver.url("/hooks/cancel-running")}).json()
    wait_for_job(http, api, job["job_id"], {"running"})

    def past_its_first_step() -> bool:
        return get_job(http, api, job["job_id"]).json()["progress"]["step"] >= 1

    wait_for(past_its_first_step, 60, "the running job to take its first step", interval=0.05)

    response = http.post(job["cancel_url"], headers=auth(), timeout=10)
    canceled = wait_for_job(http, api, job["job_id"], {"canceled"}, timeout=60)

    assert response.status_code == 202 and response.json()["cancel_requested"] is True
    assert 0 < canceled["progress"]["step"] < SLOW["num_inference_steps"]
    assert canceled["image_url"] is None
    events = receiver.wait_for(
        "/hooks/cancel-running", lambda got: any(d.payload["type"] == "job.canceled" for d in got)
    )
    assert [d.payload["type"] for d in events] == ["job.started", "job.canceled"]


def test_canceling_a_queued_job_sends_its_canceled_event_from_the_api(api, worker, http, receiver, module_redis):
    with generation_paused(worker, module_redis.url):
        job = submit(http, api, {**SMALL, "webhook_url": receiver.url("/hooks/cancel-queued")}).json()
        assert get_job(http, api, job["job_id"]).json()["state"] == "queued"

        response = http.post(job["cancel_url"], headers=auth(), timeout=10)

    assert response.status_code == 200 and response.json()["state"] == "canceled"
    [delivery] = receiver.wait_for("/hooks/cancel-queued", lambda got: len(got) >= 1)
    assert delivery.payload["type"] == "job.canceled" and delivery.payload["data"]["job_id"] == job["job_id"]
    verify_signature(delivery)


def test_a_job_not_started_by_its_deadline_ends_expired(api, worker, http, module_redis):
    with generation_paused(worker, module_redis.url):
        deadline = datetime.now(UTC) + timedelta(seconds=2)
        job = submit(http, api, {**SMALL, "deadline": deadline.isoformat()}).json()
        time.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + 0.5)

    expired = wait_for_job(http, api, job["job_id"], {"expired"})

    assert expired["error"]["code"] == "deadline_exceeded"
    assert expired["image_url"] is None


def _picture_bytes(image_format: str, size: tuple[int, int] = (64, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.radial_gradient("L").resize(size).convert("RGB").save(buffer, format=image_format)
    return buffer.getvalue()


def test_an_uploaded_init_image_gives_an_img2img_job_whose_jpeg_output_decodes_as_jpeg(api, worker, http):
    uploaded = http.post(
        f"{api.url}/v1/uploads", data=_picture_bytes("PNG"), headers={**auth(), "Content-Type": "image/png"}, timeout=10
    )
    assert uploaded.status_code == 201, uploaded.text
    body = {
        **SMALL,
        "width": 64,
        "init_image": uploaded.json()["id"],
        "strength": 0.5,
        "output_format": "jpeg",
        "output_quality": 80,
    }

    done = wait_for_job(http, api, submit(http, api, body).json()["job_id"], {"succeeded"})
    image = http.get(done["image_url"], headers=auth(), timeout=30)

    assert done["progress"]["step"] == done["progress"]["total"] == 2, "half of the 4 steps run"
    assert image.status_code == 200 and image.headers["Content-Type"] == "image/jpeg"
    with Image.open(io.BytesIO(image.content)) as jpeg:
        assert jpeg.format == "JPEG" and jpeg.size == (64, 64)


def test_an_inline_inpainting_job_gives_a_webp_that_decodes_as_webp(api, worker, http):
    mask = io.BytesIO()
    Image.new("L", (64, 64), 255).save(mask, format="PNG")
    uri = "data:image/{};base64,{}".format
    body = {
        **SMALL,
        "width": 64,
        "output_format": "webp",
        "init_image": uri("jpeg", base64.b64encode(_picture_bytes("JPEG")).decode()),
        "mask_image": uri("png", base64.b64encode(mask.getvalue()).decode()),
    }

    done = wait_for_job(http, api, submit(http, api, body).json()["job_id"], {"succeeded"})
    image = http.get(done["image_url"], headers=auth(), timeout=30)

    assert image.status_code == 200 and image.headers["Content-Type"] == "image/webp"
    with Image.open(io.BytesIO(image.content)) as webp:
        assert webp.format == "WEBP" and webp.size == (64, 64)


def test_a_rotated_jpeg_and_an_odd_mask_are_read_by_the_worker_as_the_api_read_them(api, worker, http):
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 128x64; viewers show it turned, 64x128
    stored = Image.linear_gradient("L").resize((128, 64)).convert("RGB")
    sideways = io.BytesIO()
    stored.save(sideways, format="JPEG", exif=exif.tobytes())
    upright = Image.open(io.BytesIO(sideways.getvalue())).transpose(Image.Transpose.ROTATE_270).convert("RGB")
    mask = Image.new("LA", (64, 128), (0, 255))
    mask.paste((255, 255), (0, 0, 64, 64))  # repaint the top half, keep the bottom
    mask_bytes = io.BytesIO()
    mask.save(mask_bytes, format="PNG")
    wrapped = base64.urlsafe_b64encode(mask_bytes.getvalue()).decode().rstrip("=")
    wrapped = "\n".join(wrapped[i : i + 76] for i in range(0, len(wrapped), 76))
    uploaded = http.post(
        f"{api.url}/v1/uploads", data=sideways.getvalue(), headers={**auth(), "Content-Type": "image/jpeg"}, timeout=10
    )
    body = {
        **{name: value for name, value in SMALL.items() if name not in ("height", "width")},  # the image's size
        "init_image": uploaded.json()["id"],
        "mask_image": f"data:image/png;charset=x;base64,{wrapped}",
    }

    done = wait_for_job(http, api, submit(http, api, body).json()["job_id"], {"succeeded"})
    image = http.get(done["image_url"], headers=auth(), timeout=30)

    assert (uploaded.json()["width"], uploaded.json()["height"]) == (64, 128)
    with Image.open(io.BytesIO(image.content)) as output:
        assert output.size == (64, 128)
        kept = np.asarray(output.convert("RGB"))[64:]
    assert np.array_equal(kept, np.asarray(upright)[64:]), "the kept half is the init image as viewers show it"
