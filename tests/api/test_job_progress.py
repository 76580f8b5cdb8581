"""A job's progress in the API is its own step count (issue 33), as the engine counts it: a 2-image job of
8 steps shows `x/8` in its view and its progress webhooks, and a folder model's img2img job shows the total
its engine runs, by the family its workers serve it with, not one guessed from its name.

In-process (create_app + test_client on a real Redis); the folder model is builtin:tiny-flux's own folder,
loaded by a real engine for the count it runs.
"""

from __future__ import annotations

import time

from batching import DiffusionEngine, EngineConfig, GenerationParams
from batching.builtin_model import builtin_model_path
from storage.heartbeats import Heartbeat
from storage.job_store import JobState, JobStore
from storage.webhooks import build_payload
from tests.support.calls import auth
from tests.support.job_factories import take_job
from tests.support.pictures import init_picture, png_data_uri

DEADLINE_SECONDS = 10.0


def view(client, job_id: str) -> dict:
    response = client.get(f"/v1/jobs/{job_id}", headers=auth())
    assert response.status_code == 200, response.json
    return response.json


def test_a_two_image_jobs_view_and_progress_webhook_count_its_own_steps(client, redis_url):
    body = {"prompt": "a red fox", "seed": 1, "num_inference_steps": 8, "num_images": 2, "height": 64, "width": 64}
    job_id = client.post("/v1/jobs", json=body, headers=auth()).json["job_id"]

    assert view(client, job_id)["progress"] == {"step": 0, "total": 8}, "queued: the job's step count, not 16"
    with JobStore(redis_url) as store:
        holder = take_job(store, job_id).holder
        store.set_progress(job_id, 5, 8, current_image=2)  # as a worker running its images one after another
        running = view(client, job_id)
        payload = build_payload(store.get(job_id), "progress", status_url="http://127.0.0.1/x")
        store.set_progress(job_id, 6, 8)  # its images run together again
        together = view(client, job_id)
        store.finish(job_id, JobState.SUCCEEDED, holder=holder, progress_step=8, progress_total=8)

    assert running["progress"] == {"step": 5, "total": 8, "current_image": 2}
    assert payload["data"]["progress"] == {"step": 5, "total": 8, "current_image": 2}
    assert together["progress"] == {"step": 6, "total": 8}
    assert view(client, job_id)["progress"] == {"step": 8, "total": 8}


def test_a_folder_models_img2img_job_shows_the_total_its_engine_runs_once_a_worker_serves_it(client, redis_url):
    folder = str(builtin_model_path("builtin:tiny-flux"))
    init = png_data_uri(init_picture())
    body = {"prompt": "a red fox", "model": folder, "seed": 1, "num_inference_steps": 10, "strength": 0.75}
    engine = DiffusionEngine(EngineConfig(model=folder, device="cpu", max_num_seqs=1))
    try:
        engine.pause()  # the count is known at submit: no need to run it
        future = engine.submit(GenerationParams(**body, init_image=init, height=64, width=64))
        engine_total, family = future.num_steps_total, engine.stats()["family"]
    finally:
        engine.shutdown(abort=True)
    response = client.post("/v1/jobs", json={**body, "init_image": init, "height": 64, "width": 64}, headers=auth())
    assert response.status_code == 202, response.json
    job_id = response.json["job_id"]
    guessed = view(client, job_id)["progress"]["total"]  # no worker heard from: the fallback family's rounding

    with JobStore(redis_url) as store:  # what the worker serving that engine publishes
        store.heartbeat_store.beat(Heartbeat("w1", folder, "q", family, 1, time.time()))
    deadline = time.monotonic() + DEADLINE_SECONDS  # the API reads heartbeats at most once a second
    while view(client, job_id)["progress"]["total"] != engine_total and time.monotonic() < deadline:
        time.sleep(0.1)

    assert (family, engine_total) == ("flux", 8) and guessed == 7, "the two rules differ for this job"
    assert view(client, job_id)["progress"]["total"] == engine_total
