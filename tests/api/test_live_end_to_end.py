"""Waiting submits, event streams, progress webhooks and the OpenAI images API end to end: `stepwise api`
(granian) over real HTTP, a real Celery worker with builtin:tiny, real Redis. Clients are libraries:
httpx-sse for the event stream, the Standard Webhooks library for signatures, the official `openai`
package for /v1/images."""

from __future__ import annotations

import base64
import io
from datetime import datetime

import httpx
import numpy as np
import openai
import pytest
import standardwebhooks
from httpx_sse import connect_sse
from PIL import Image

from tests.support.calls import auth, submit, wait_for_job
from tests.support.processes import TENANT_KEYS, WEBHOOK_SECRET, ApiProcess
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.workers

SHORT = {"prompt": "a red fox", "seed": 7, "num_inference_steps": 4, "height": 64, "width": 96, "guidance_scale": 1.0}
LONG = {"prompt": "a long walk", "seed": 3, "num_inference_steps": 200, "height": 256, "width": 256}
STREAMED = {"prompt": "a lighthouse", "seed": 5, "num_inference_steps": 60, "height": 128, "width": 128}


@pytest.fixture(scope="module")
def live_api(module_redis, storage_url, tmp_path_factory):
    """`stepwise api` refusing models no worker serves (so an unknown model is an error, as OpenAI's is)."""
    server = ApiProcess(
        tmp_path_factory.mktemp("live-api"),
        module_redis.url,
        storage_url,
        STEPWISE_ACCEPT_UNSERVED_MODELS="false",
        STEPWISE_EVENTS_KEEPALIVE_SECONDS="1",
        STEPWISE_IMAGES_WAIT_SECONDS="120",
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def serving(live_api, worker, http_module):
    """The API and a worker it has seen (its heartbeat is in)."""

    def models() -> list[dict]:
        return http_module.get(f"{live_api.url}/v1/models", headers=auth(), timeout=10).json()["models"]

    def tiny_is_available() -> bool:
        return any(model["model"] == "builtin:tiny" and model["available"] for model in models())

    wait_for(tiny_is_available, 60, lambda: f"the API to see the worker: {models()}", interval=0.2)
    return live_api


@pytest.fixture(scope="module")
def http_module():
    with httpx.Client(timeout=60) as client:
        yield client


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_prefer_wait_returns_a_short_job_finished_and_a_long_one_running_with_its_location(serving, http):
    short = submit(http, serving, SHORT, Prefer="wait=60")
    long = submit(http, serving, LONG, Prefer="wait=2")
    http.post(f"{serving.url}/v1/jobs/{long.json()['job_id']}/cancel", headers=auth(), timeout=10)

    assert short.status_code == 200, short.text
    assert short.json()["state"] == "succeeded" and short.json()["image_url"]
    assert short.headers["Preference-Applied"] == "wait=60" and "Location" not in short.headers
    assert long.status_code == 202, long.text
    assert long.json()["state"] in ("queued", "running")
    assert long.headers["Location"] == long.json()["status_url"]
    assert long.headers["Preference-Applied"] == "wait=2"


def test_a_real_jobs_event_stream_rises_to_its_end_and_resumes_after_the_last_event_id(serving, http, http_module):
    job_id = submit(http, serving, STREAMED).json()["job_id"]
    url = f"{serving.url}/v1/jobs/{job_id}/events"

    with connect_sse(http_module, "GET", url, headers=auth()) as source:
        first = []
        for event in source.iter_sse():
            first.append(event)
            if event.event == "progress":
                break  # the client goes away mid-job
    with connect_sse(http_module, "GET", url, headers={**auth(), "Last-Event-ID": first[-1].id}) as source:
        rest = list(source.iter_sse())
    other_tenant = http_module.get(url, headers=auth("bob"))

    names = [event.event for event in first + rest]
    assert names[0] in ("queued", "started") and names[-1] == "succeeded"
    assert "started" in names and names.count("succeeded") == 1
    progress = [event.json() for event in first + rest if event.event == "progress"]
    steps = [item["step"] for item in progress]
    assert len(steps) >= 2 and steps == sorted(set(steps)), steps  # rising, none repeated across the reconnect
    assert all(item["total"] == 60 for item in progress) and steps[-1] <= 60
    ids = [event.id for event in rest if event.id]
    assert len(ids) == len(set(ids)) and first[-1].id not in ids
    end = rest[-1].json()
    assert end["state"] == "succeeded" and end["progress"] == {"step": 60, "total": 60} and end["image_urls"]
    assert other_tenant.status_code == 404


def test_a_job_asking_for_previews_streams_them_in_order_and_one_without_gets_none(serving, http, http_module):
    with_previews = submit(http, serving, {**STREAMED, "seed": 6, "preview_every": 4}).json()["job_id"]
    without = submit(http, serving, {**STREAMED, "seed": 6}).json()["job_id"]

    def events_of(job_id: str) -> list:
        with connect_sse(http_module, "GET", f"{serving.url}/v1/jobs/{job_id}/events", headers=auth()) as source:
            return list(source.iter_sse())

    streamed, plain = events_of(with_previews), events_of(without)

    names = [event.event for event in streamed]
    assert names[0] in ("queued", "started") and names[-1] == "succeeded" and "started" in names
    stepped = [(event.event, event.json()) for event in streamed if event.event in ("progress", "preview")]
    steps = [data["step"] for _, data in stepped]
    assert steps == sorted(steps) and all(data["total"] == 60 for _, data in stepped), steps
    previews = [data for name, data in stepped if name == "preview"]
    assert previews and all(data["step"] % 4 == 0 and data["step"] < 60 for data in previews), previews
    header, encoded = previews[-1]["image"].split(",", 1)
    image = Image.open(io.BytesIO(base64.b64decode(encoded)))
    assert header == "data:image/jpeg;base64" and image.size == (128, 128)  # at most 256 px: the image's own size
    assert streamed[-1].json()["progress"] == {"step": 60, "total": 60}
    assert "preview" not in [event.event for event in plain] and plain[-1].event == "succeeded"
    final = [
        http.get(f"{serving.url}/v1/jobs/{job_id}/image", headers=auth(), timeout=30)
        for job_id in (with_previews, without)
    ]
    pixels = [np.asarray(Image.open(io.BytesIO(response.content)).convert("RGB"), int) for response in final]
    assert np.abs(pixels[0] - pixels[1]).max() <= 1  # the same image, previews or not


def test_progress_webhooks_come_at_most_once_a_second_and_verify_with_standard_webhooks(serving, http):
    with WebhookReceiver() as receiver:
        body = {
            **STREAMED,
            "num_inference_steps": 100,
            "webhook_url": receiver.url("/hooks/progress"),
            "webhook_events": ["progress", "completed"],
        }
        job_id = submit(http, serving, body).json()["job_id"]
        wait_for_job(http, serving, job_id, {"succeeded"})
        deliveries = receiver.wait_for(
            "/hooks/progress", lambda got: any(d.payload["type"] == "job.completed" for d in got)
        )

    verifier = standardwebhooks.Webhook(WEBHOOK_SECRET)
    payloads = [verifier.verify(delivery.body, delivery.headers) for delivery in deliveries]
    progress = [payload for payload in payloads if payload["type"] == "job.progress"]
    assert progress, [payload["type"] for payload in payloads]
    steps = [payload["data"]["progress"]["step"] for payload in progress]
    assert steps == sorted(steps) and all(payload["data"]["progress"]["total"] == 100 for payload in progress)
    sent_at = sorted(datetime.fromisoformat(payload["timestamp"].replace("Z", "+00:00")) for payload in progress)
    assert all((later - earlier).total_seconds() >= 0.99 for earlier, later in zip(sent_at, sent_at[1:]))
    assert len({delivery.headers["webhook-id"] for delivery in deliveries}) == len(deliveries)


def test_the_openai_client_generates_and_edits_through_a_real_worker(serving, http):
    client = openai.OpenAI(api_key=TENANT_KEYS["alice"], base_url=f"{serving.url}/v1", max_retries=0, timeout=180)

    generated = client.images.generate(
        model="builtin:tiny", prompt="a red fox", n=2, size="64x64", extra_body={"num_inference_steps": 4, "seed": 9}
    )
    by_url = client.images.generate(
        model="builtin:tiny",
        prompt="a red fox",
        size="96x64",
        response_format="url",
        output_format="jpeg",
        extra_body={"num_inference_steps": 4},
    )
    blue = Image.new("RGB", (64, 64), (20, 40, 220))
    mask = Image.new("RGBA", (64, 64), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (0, 0, 32, 64))  # transparent left half: edit it; opaque right half: keep it
    edited = client.images.edit(
        model="builtin:tiny",
        image=("photo.png", png(blue), "image/png"),
        mask=("mask.png", png(mask), "image/png"),
        prompt="a fox",
        extra_body={"num_inference_steps": 4},
    )

    images = [Image.open(io.BytesIO(base64.b64decode(item.b64_json))) for item in generated.data]
    assert [image.size for image in images] == [(64, 64), (64, 64)] and generated.size == "64x64"
    assert np.asarray(images[0]).tobytes() != np.asarray(images[1]).tobytes()  # seeds 9 and 10
    fetched = http.get(by_url.data[0].url, headers=auth(), timeout=30)
    assert fetched.headers["Content-Type"] == "image/jpeg" and by_url.output_format == "jpeg"
    assert Image.open(io.BytesIO(fetched.content)).size == (96, 64)
    result = np.asarray(Image.open(io.BytesIO(base64.b64decode(edited.data[0].b64_json))).convert("RGB"), float)
    kept = np.abs(result[:, 40:] - np.asarray(blue, float)[:, 40:]).mean()
    assert result.shape == (64, 64, 3) and kept < 12, kept  # the opaque part of OpenAI's mask is kept


def test_the_openai_client_gets_openai_shaped_errors(serving):
    client = openai.OpenAI(api_key=TENANT_KEYS["alice"], base_url=f"{serving.url}/v1", max_retries=0)
    stranger = openai.OpenAI(api_key="sk_not_a_key", base_url=f"{serving.url}/v1", max_retries=0)

    with pytest.raises(openai.BadRequestError) as bad_size:
        client.images.generate(model="builtin:tiny", prompt="a fox", size="huge")
    with pytest.raises(openai.NotFoundError) as unknown_model:
        client.images.generate(model="dall-e-9", prompt="a fox")
    with pytest.raises(openai.BadRequestError) as unknown_field:
        client.images.generate(model="builtin:tiny", prompt="a fox", extra_body={"colour": "red"})
    with pytest.raises(openai.AuthenticationError):
        stranger.images.generate(model="builtin:tiny", prompt="a fox")

    assert bad_size.value.body["param"] == "size" and bad_size.value.body["type"] == "invalid_request_error"
    assert unknown_model.value.body["code"] == "model_not_found" and unknown_model.value.body["param"] == "model"
    assert unknown_field.value.body["message"] == "Unrecognized request argument supplied: colour"
