"""`stepwise submit` against a running `stepwise up`: saved images, input images, the API found through the
environment, refused fields and failed jobs as exit codes."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from PIL import Image

from storage.job_store import JobStore
from tests.support.servers import child_env
from tests.support.up_process import (
    STEPWISE,
    TINY,
    run_cli,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.xdist_group("stepwise-up")]  # the folder's one `up`


def test_submit_wait_saves_the_image_from_a_fresh_stepwise_up(up, tmp_path):
    result = run_cli(
        "submit",
        "a red fox",
        "--seed",
        "7",
        *TINY,
        "--wait",
        "--out",
        str(tmp_path / "out"),
        "--var-dir",
        str(up.var_dir),
        cwd=tmp_path,
    )
    elapsed = time.monotonic() - up.started_at
    assert result.returncode == 0, result.stderr + up.log()
    (path,) = (tmp_path / "out").glob("*.png")
    assert result.stdout.strip() == str(path)
    with Image.open(path) as image:
        assert image.size == (64, 64)
    print(f"stepwise up start -> first image saved: {elapsed:.1f}s")


def test_submit_with_an_init_image_and_mask_saves_a_jpeg_of_the_images_size(up, tmp_path):
    Image.radial_gradient("L").resize((64, 64)).convert("RGB").save(tmp_path / "photo.png")
    Image.new("L", (64, 64), 255).save(tmp_path / "mask.png")
    result = run_cli(
        "submit",
        "a red door",
        "--seed",
        "3",
        "--steps",
        "4",
        "--init-image",
        str(tmp_path / "photo.png"),
        "--mask",
        str(tmp_path / "mask.png"),
        "--strength",
        "0.5",
        "--format",
        "jpeg",
        "--out",
        str(tmp_path / "out"),
        "--var-dir",
        str(up.var_dir),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr + up.log()
    (path,) = (tmp_path / "out").glob("*.jpeg")
    with Image.open(path) as image:
        assert image.format == "JPEG" and image.size == (64, 64)


def test_submit_finds_the_api_through_the_environment(up, tmp_path):
    saved = json.loads((up.var_dir / "stepwise.json").read_text())
    env = child_env(STEPWISE_API_URL=saved["api_url"], STEPWISE_API_KEY=saved["api_key"])
    result = subprocess.run(
        [*STEPWISE, "submit", "a blue bird", *TINY, "--wait"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert "/v1/jobs/" in result.stdout  # without --out it prints the image URL


def test_submit_refused_field_exits_non_zero_naming_the_field(up, tmp_path):
    result = run_cli("submit", "a red fox", "--size", "65", "--var-dir", str(up.var_dir), cwd=tmp_path)
    assert result.returncode == 1
    assert "width" in result.stderr or "height" in result.stderr


def test_submit_wait_exits_non_zero_with_the_jobs_error_when_it_does_not_succeed(up, tmp_path):
    waiting = subprocess.Popen(
        [
            *STEPWISE,
            "submit",
            "a slow fox",
            "--size",
            "64",
            "--steps",
            "200",
            "--wait",
            "--var-dir",
            str(up.var_dir),
            "--json",
        ],
        cwd=tmp_path,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        store = JobStore(up.redis_url)

        def slow_fox_id() -> str | None:
            records, _ = store.list_for_tenant("local", limit=5)
            return next((r.job_id for r in records if r.params["prompt"] == "a slow fox"), None)

        job_id = wait_for(slow_fox_id, 60, "the job to appear in Redis")
        store.request_cancel(job_id)
        store.close()
        stdout, stderr = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 1
    assert f"job {job_id} canceled" in stderr
