"""`stepwise up`'s processes: no Celery banner, a second worker beside it, a SIGKILLed worker restarted, and
SIGTERM leaving no process (last in this folder: it stops the shared `up`)."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import time
from datetime import datetime

import psutil
import pytest
import requests
from PIL import Image

from tests.support.servers import child_env, wait_until_gone
from tests.support.up_process import (
    STARTUP_TIMEOUT,
    STEPWISE,
    api_call,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.xdist_group("stepwise-up")]  # the folder's one `up`


def test_up_prints_no_celery_banner_and_no_note_about_running_as_root(up):
    log = up.log_path.read_text()

    assert "[config]" not in log and ".> transport:" not in log  # Celery's banner, once per worker before
    assert "running as root" not in log and "superuser privileges" not in log  # up runs as root here
    assert "stepwise is up after" in log


def test_a_second_worker_started_beside_up_finds_ups_settings_and_serves_another_model(up, tmp_path):
    saved = json.loads((up.var_dir / "stepwise.json").read_text())
    assert saved["service_env"]["STEPWISE_REDIS_URL"] == up.redis_url
    banner_port = re.search(r"worker http://127\.0\.0\.1:(\d+)/metrics", up.log_path.read_text()).group(1)
    assert saved["worker_metrics_port"] == int(banner_port)  # kept for the next run, as the Redis port is
    log_path = tmp_path / "second-worker.log"
    with log_path.open("wb") as log:  # as a user types it in up's folder: no STEPWISE_* variable set
        second = subprocess.Popen(
            [*STEPWISE, "worker", "--model", "builtin:shapes", "--metrics-port", "0"],
            cwd=up.workdir,
            env=child_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def shapes_served() -> bool:
            assert second.poll() is None, log_path.read_text()
            models = api_call(up, "GET", "/v1/models")["models"]
            return any(model["model"] == "builtin:shapes" and model["available"] for model in models)

        wait_for(shapes_served, STARTUP_TIMEOUT, lambda: f"the second worker's model:\n{log_path.read_text()}")
        # few steps: the first job of a fresh worker is slow on a busy CPU, and the drawing is not the point here
        body = {"prompt": "a red circle on a blue background", "model": "builtin:shapes", "num_inference_steps": 4}
        job_id = api_call(up, "POST", "/v1/jobs", json=body)["job_id"]
        done = wait_for(
            lambda: (view := api_call(up, "GET", f"/v1/jobs/{job_id}"))["state"] not in ("queued", "running") and view,
            240,
            lambda: f"the shapes job to end:\n{log_path.read_text()}",
            interval=0.5,
        )
        image = requests.get(
            f"{saved['api_url']}/v1/jobs/{job_id}/image",
            headers={"Authorization": f"Bearer {saved['api_key']}"},
            timeout=30,
        )
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(60)
        except subprocess.TimeoutExpired:
            second.kill()
            second.wait()

    assert done["state"] == "succeeded", done
    joined = log_path.read_text()  # it says where its settings came from
    assert "joining the `stepwise up` that runs from here: STEPWISE_STORAGE_URL" in joined, joined
    assert done["params"]["model"] == "builtin:shapes" and done["attempts"] == 1
    with Image.open(io.BytesIO(image.content)) as drawn:  # stored where up's API reads images
        assert drawn.size == (128, 128)  # builtin:shapes' size (up's builtin:tiny would draw its default too)


def test_a_sigkilled_worker_is_restarted_and_its_job_requeued_from_its_heartbeat_within_15s(up):
    body = {"prompt": "survives a SIGKILL", "height": 64, "width": 64, "num_inference_steps": 30, "guidance_scale": 1}
    job_id = api_call(up, "POST", "/v1/jobs", json=body)["job_id"]
    first = wait_for(
        lambda: (view := api_call(up, "GET", f"/v1/jobs/{job_id}"))["progress"]["step"] >= 1 and view,
        120,
        lambda: f"job {job_id} to be running:\n{up.log()}",
        interval=0.05,
    )
    worker = next(  # the generating worker, not the webhook one
        p
        for p in psutil.Process(up.process.pid).children()
        if "worker" in p.cmdline() and "--queues" not in p.cmdline()
    )

    worker.kill()
    killed_at = time.time()
    requeued = wait_for(
        lambda: (view := api_call(up, "GET", f"/v1/jobs/{job_id}"))["requeued"] and view,
        60,
        lambda: f"job {job_id} to be re-queued:\n{up.log()}",
    )
    done = wait_for(
        lambda: (view := api_call(up, "GET", f"/v1/jobs/{job_id}"))["state"] == "succeeded" and view,
        240,
        lambda: f"job {job_id} to succeed:\n{up.log()}",
        interval=0.5,
    )

    requeued_at = datetime.fromisoformat(requeued["requeued"]["at"]).timestamp()
    assert requeued_at - killed_at < 15, requeued_at - killed_at
    assert requeued["requeued"]["reason"] == "worker_lost"
    # `attempts` counts takes (storage.job_record): 1 while the job waits again, 2 once the restarted worker,
    # which may well be up before the heartbeat gives the dead one away, has taken it before a poll saw it.
    assert requeued["attempts"] == (1 if requeued["state"] == "queued" else 2), requeued
    assert done["attempts"] == 2 and done["started_at"] == first["started_at"]
    first_run = requeued_at - datetime.fromisoformat(first["started_at"]).timestamp()
    assert done["timings"]["queue_wait"] < done["timings"]["total"] - first_run
    assert "worker was killed by SIGKILL" in up.log() and "restarted worker" in up.log()


def test_sigterm_stops_every_child_and_leaves_no_process(up):
    children = up.descendants()
    names = " ".join(" ".join(p.cmdline()) for p in children)
    assert "redis-server" in names and " worker" in names and " api" in names
    assert up.stop() == 0, up.log()
    alive = wait_until_gone(children, timeout=10)
    assert not alive, f"left running: {[p.cmdline() for p in alive]}\n{up.log()}"
    assert "[api]" in up.log() and "[worker]" in up.log() and "[redis]" in up.log()
