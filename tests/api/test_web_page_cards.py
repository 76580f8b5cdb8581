"""The web page's job cards in headless Chromium, against the API in this process with no worker: the store plays
one, so each card's state is set exactly (a multi-image job's count, a followed job's stream, a video)."""

from __future__ import annotations

import json
import time

import pytest
from PIL import Image

from core.output_encoding import encode_video
from storage.job_store import JobState
from tests.support.calls import auth
from tests.support.job_factories import take_job
from tests.support.web_page import console_errors, open_page, page_app, script, serving, text_of, wait_until

pytestmark = pytest.mark.browser


def test_a_multi_image_jobs_card_counts_its_own_steps_and_names_the_image_it_is_on(browser, redis_url, tmp_path):
    app = page_app(redis_url, tmp_path)
    store = app.extensions["stepwise.job_store"]
    client = app.test_client()
    body = {"prompt": "a red circle", "num_images": 2, "num_inference_steps": 8, "height": 64, "width": 64}
    canceled, running = (client.post("/v1/jobs", json=body, headers=auth()).json["job_id"] for _ in range(2))
    holders = {job_id: take_job(store, job_id, "fake-worker").holder for job_id in (canceled, running)}
    store.set_progress(running, 5, 8, current_image=2)  # as a worker running its images one after another
    store.finish(canceled, JobState.CANCELED, holder=holders[canceled], progress_step=3, progress_total=8)
    with serving(app) as url:
        open_page(browser, url)
        card = "li.job[data-job-id='{}'] .meta"
        wait_until(
            lambda: "step 5/8 · image 2 of 2" in text_of(browser, card.format(running)),
            30,
            "the running job's card to count its own steps and name its image",
            seen=lambda: text_of(browser, card.format(running)),
        )
        assert "canceled · step 3/8" in text_of(browser, card.format(canceled)), "its own count, not of 16"


def test_a_followed_jobs_stream_that_ends_with_reconnect_is_followed_again_and_its_card_stays_whole(
    browser, redis_url, tmp_path
):
    """An API process that stops ends its streams with a `reconnect` event (api.event_stream), and the client
    follows the job on from another connection. Here the job's first connection answers only that event, as a
    stopping replica does; the page must keep the job's card as it was and follow it again."""
    app = page_app(redis_url, tmp_path)
    body = {"prompt": "a green square", "num_inference_steps": 8, "height": 64, "width": 64}
    job_id = app.test_client().post("/v1/jobs", json=body, headers=auth()).json["job_id"]  # it stays queued
    connections: list[float] = []

    def stopping_once(environ, start_response):
        if environ["PATH_INFO"] == f"/v1/jobs/{job_id}/events":
            connections.append(time.monotonic())
            if len(connections) == 1:
                start_response("200 OK", [("Content-Type", "text/event-stream"), ("Cache-Control", "no-store")])
                reason = "this API process is shutting down: reconnect (with Last-Event-ID) to follow the job on"
                data = json.dumps({"job_id": job_id, "reason": reason})
                return [f"retry: 500\nevent: reconnect\ndata: {data}\n\n".encode()]
        return app(environ, start_response)

    card = f"li.job[data-job-id='{job_id}']"
    with serving(stopping_once) as url:
        open_page(browser, url)
        wait_until(lambda: len(connections) >= 2, 30, "the page to follow the job again", seen=lambda: connections)
        assert text_of(browser, f"{card} .prompt") == "a green square", "the card as it was, not one of the event"
        assert "queued" in text_of(browser, f"{card} .state")
        assert console_errors(browser) == []


def test_a_video_jobs_card_plays_its_mp4(browser, redis_url, tmp_path):
    """A succeeded video job (with an MP4 encoded as the worker encodes one) shows in a <video> element that the
    browser decodes to the video's size."""
    app = page_app(redis_url, tmp_path)
    store, images = app.extensions["stepwise.job_store"], app.extensions["stepwise.image_store"]
    body = {"model": "builtin:tiny-wan", "prompt": "a red circle", "num_frames": 9, "height": 64, "width": 96}
    job_id = app.test_client().post("/v1/jobs", json=body, headers=auth()).json["job_id"]
    holder = take_job(store, job_id, "fake-worker").holder
    key = images.key_for(job_id, 0, "mp4")
    frames = [Image.new("RGB", (96, 64), (30 * index, 80, 160)) for index in range(9)]
    images.put_image(key, encode_video(frames, "mp4", fps=16), {"job_id": job_id})
    store.finish(job_id, JobState.SUCCEEDED, holder=holder, image_keys=[key])
    with serving(app) as url:
        open_page(browser, url)
        video = f"li.job[data-job-id='{job_id}'] video"
        size = wait_until(
            lambda: script(
                browser,
                "const v = document.querySelector(arguments[0]); return v && v.readyState >= 1 && [v.videoWidth, "
                "v.videoHeight]",
                video,
            ),
            30,
            "the video job's card to load its MP4",
            seen=lambda: text_of(browser, f"li.job[data-job-id='{job_id}']"),
        )
        assert size == [96, 64]
        assert "9 frames at 16 fps" in text_of(browser, f"li.job[data-job-id='{job_id}']")
