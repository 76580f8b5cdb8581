"""`stepwise up`'s processes: no Celery banner, the README's video worker beside it, a SIGKILLed worker restarted, and
SIGTERM leaving no process, after which Celery's tools in its folder say its service is gone (last in this folder:
it stops the shared `up`)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import av
import psutil

from tests.support.servers import child_env, wait_until_gone
from tests.support.up_process import (
    STARTUP_TIMEOUT,
    api_call,
    readme_block,
)
from tests.support.waiting import wait_for


def test_up_prints_no_celery_banner_and_no_note_about_running_as_root(up):
    log = up.log_path.read_text()

    assert "[config]" not in log and ".> transport:" not in log  # Celery's banner, once per worker before
    assert "running as root" not in log and "superuser privileges" not in log  # up runs as root here
    assert "stepwise is up after" in log


def test_the_readmes_video_worker_started_beside_up_joins_its_service_and_the_readmes_clip_is_saved(up, tmp_path):
    """The README's video block as written, in up's folder with no STEPWISE_* variable set: its worker line (run
    in the background, as its `&` says) joins up's service, and its submit saves the clip as an MP4."""
    saved = json.loads((up.var_dir / "stepwise.json").read_text())
    assert saved["service_env"]["STEPWISE_REDIS_URL"] == up.redis_url
    banner_port = re.search(r"worker http://127\.0\.0\.1:(\d+)/metrics", up.log_path.read_text()).group(1)
    assert saved["worker_metrics_port"] == int(banner_port)  # kept for the next run, as the Redis port is
    block = readme_block("stepwise worker --model")
    worker_line, submit_line = [
        line.split("#")[0].strip() for line in block.splitlines() if line.startswith("stepwise")
    ]
    assert worker_line.endswith("&")
    bin_dir = Path(sys.executable).parent  # what `source .venv/bin/activate` puts first on PATH
    env = child_env(PATH=f"{bin_dir}:{os.environ['PATH']}")
    log_path = tmp_path / "video-worker.log"
    with log_path.open("wb") as log:
        video_worker = subprocess.Popen(
            # --metrics-port 0: a free port, not the default another test's worker on this machine may hold
            ["bash", "-c", f"exec {worker_line.removesuffix('&')} --metrics-port 0"],
            cwd=up.workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def video_model_served() -> bool:  # what the README says to wait for: the worker's model is listed
            assert video_worker.poll() is None, log_path.read_text()
            models = api_call(up, "GET", "/v1/models")["models"]
            return any(model["model"] == "builtin:tiny-wan" and model["available"] for model in models)

        wait_for(video_model_served, STARTUP_TIMEOUT, lambda: f"the video worker:\n{log_path.read_text()}")
        submitted = subprocess.run(
            ["bash", "-c", submit_line],
            cwd=up.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=STARTUP_TIMEOUT + 240,
        )
    finally:
        video_worker.send_signal(signal.SIGTERM)
        try:
            video_worker.wait(60)
        except subprocess.TimeoutExpired:
            video_worker.kill()
            video_worker.wait()

    assert submitted.returncode == 0, submitted.stdout + submitted.stderr + log_path.read_text()
    (clip,) = (up.workdir / "out").glob("*.mp4")
    with av.open(str(clip)) as video:
        num_frames = sum(1 for _ in video.decode(video.streams.video[0]))
    assert num_frames == int(re.search(r"--num-frames (\d+)", submit_line).group(1))
    joined = log_path.read_text()  # it says where its settings came from
    assert "joining the `stepwise up` that runs from here: STEPWISE_STORAGE_URL" in joined, joined


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

    celery = str(Path(sys.executable).with_name("celery"))  # in its folder now: says what it tried, tries no other
    ping = subprocess.run(
        [celery, "-A", "worker", "inspect", "ping", "-t", "2"],
        cwd=up.workdir,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ping.returncode == 2, ping.stdout + ping.stderr
    assert ping.stderr.strip() == (
        f"stepwise: STEPWISE_REDIS_URL is not set, and {up.var_dir / 'stepwise.json'} names Redis {up.redis_url} of "
        f"the `stepwise up` with pid {up.process.pid}, which is not running: start it again (`stepwise up` or "
        "`make run` in this folder), or set STEPWISE_REDIS_URL to the Redis you mean (the default is not tried: "
        "another program may answer there)"
    )
