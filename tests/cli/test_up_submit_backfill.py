"""End to end: `stepwise up` on free ports, then `stepwise submit` and `stepwise backfill` against it.

One `stepwise up` serves the whole module (the worker loads its model once); the last test
stops it with SIGTERM and checks that no process it started is left.
"""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest
import requests
from PIL import Image

from storage.job_store import JobStore
from tests.support.servers import child_env, free_port, wait_until_gone
from tests.support.waiting import wait_for

STARTUP_TIMEOUT = 240
STEPWISE = [sys.executable, "-m", "stepwise_cli.main"]
TINY = ["--size", "64", "--steps", "4"]


class UpProcess:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.var_dir = workdir / "var"
        self.api_port = free_port()
        self.redis_port = free_port()
        self.log_path = workdir / "up.log"
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start(self) -> UpProcess:
        self.started_at = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    *STEPWISE,
                    "up",
                    "--port",
                    str(self.api_port),
                    "--redis-port",
                    str(self.redis_port),
                    "--var-dir",
                    str(self.var_dir),
                    "--max-num-seqs",
                    "4",
                    "--api-workers",
                    "1",
                ],
                cwd=self.workdir,
                env=child_env(STEPWISE_SHUTDOWN_GRACE="5", STEPWISE_MODEL="builtin:tiny"),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def ready() -> bool:
            assert self.process.poll() is None, f"stepwise up exited early:\n{self.log()}"
            return (self.var_dir / "stepwise.json").exists()

        wait_for(ready, STARTUP_TIMEOUT, lambda: f"stepwise up to be ready:\n{self.log()}", interval=0.2)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def run_cli(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*STEPWISE, *args], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    service = UpProcess(tmp_path_factory.mktemp("up"))
    leftovers: list[psutil.Process] = []
    try:
        service.start()
        leftovers = service.descendants()
        yield service
    finally:
        service.stop()
        for process in leftovers:
            if process.is_running():
                process.kill()


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


INVALID_LINES = {
    5: "{not json",
    12: {"prompt": "odd size", "height": 65},
    23: {"prompt": "typo", "num_steps": 4},
    34: {"prompt": "  "},
    45: {"prompt": "no steps", "num_inference_steps": 0},
}


def write_prompts(path: Path) -> int:
    lines = []
    for line in range(1, 51):
        row = INVALID_LINES.get(line) or {
            "prompt": f"prompt number {line}",
            "seed": line,
            "height": 64,
            "width": 64,
            "num_inference_steps": 8,
            "guidance_scale": 1.0,
        }
        lines.append(row if isinstance(row, str) else json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return 50 - len(INVALID_LINES)


def count_jobs(redis_url: str, tenant: str = "local") -> int:
    store = JobStore(redis_url)
    try:
        total, cursor = 0, None
        while True:
            records, cursor = store.list_for_tenant(tenant, limit=100, cursor=cursor)
            total += len(records)
            if cursor is None:
                return total
    finally:
        store.close()


def test_backfill_killed_half_way_resumes_without_duplicate_jobs(up, tmp_path):
    num_jobs_before = count_jobs(up.redis_url)
    prompts = tmp_path / "prompts.jsonl"
    num_valid = write_prompts(prompts)
    out, manifest = tmp_path / "images", tmp_path / "results.jsonl"
    argv = [
        *STEPWISE,
        "backfill",
        str(prompts),
        "--out",
        str(out),
        "--manifest",
        str(manifest),
        "--concurrency",
        "4",
        "--var-dir",
        str(up.var_dir),
        "--timeout",
        "240",
    ]

    first = subprocess.Popen(argv, cwd=tmp_path, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def half_submitted() -> bool:
            assert first.poll() is None, "the first backfill ended before it was interrupted"
            return count_jobs(up.redis_url) - num_jobs_before >= num_valid // 2

        wait_for(half_submitted, 120, "the first backfill to submit half its rows", interval=0.02)
        assert first.poll() is None
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait()

    second = subprocess.run(argv, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 1, second.stderr  # the invalid rows fail the run
    assert count_jobs(up.redis_url) - num_jobs_before == num_valid

    results = {entry["line"]: entry for entry in map(json.loads, manifest.read_text().splitlines())}
    assert sorted(results) == list(range(1, 51))
    for line, entry in results.items():
        if line in INVALID_LINES:
            assert entry["state"] == "invalid" and entry["job_id"] is None and entry["error"]
            assert f"line {line}: invalid" in second.stderr
        else:
            assert entry["state"] == "succeeded", entry
            assert len(entry["images"]) == 1 and Path(entry["images"][0]).is_file()
    assert len({entry["job_id"] for entry in results.values() if entry["job_id"]}) == num_valid
    assert "45 succeeded, 5 failed" in second.stderr
    assert re.search(r"^backfill: \d+/50 rows, .* rows/s", second.stderr, re.M)  # progress in a log, not a bar
    store = JobStore(up.redis_url)
    priorities = {store.get(entry["job_id"]).priority for entry in results.values() if entry["job_id"]}
    store.close()
    assert priorities == {"low"}, "a backfill's rows go in at --priority, low by default"


def readme_block(containing: str, language: str = "sh") -> str:
    """The README's ```sh (or other `language`) block that contains `containing`, as a user would paste it."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(rf"```{language}\n(.*?)```", readme, flags=re.S)
    return next(block for block in blocks if containing in block)


def test_the_readme_curl_tour_runs_as_written_against_stepwise_up(up, tmp_path):
    saved = json.loads((up.var_dir / "stepwise.json").read_text())
    script = readme_block("export API=").replace("http://127.0.0.1:8000", saved["api_url"])
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=up.workdir,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    saved_as = re.findall(r"-o (\S+\.png)", script)[-1]  # the file the tour tells the user to open
    with Image.open(up.workdir / saved_as) as image:
        assert image.format == "PNG"


def test_the_readme_openai_script_runs_as_written_in_ups_folder_and_saves_the_image(up):
    script = readme_block("openai.OpenAI(", language="python")  # verbatim: it finds the API in var/stepwise.json
    result = subprocess.run(
        [sys.executable, "-"],
        input=script,
        cwd=up.workdir,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert result.returncode == 0, result.stdout + result.stderr + up.log()
    saved_as = re.search(r'open\("(\S+\.png)", "wb"\)', script).group(1)
    assert result.stdout.strip() == f"saved {saved_as}"
    with Image.open(up.workdir / saved_as) as image:
        assert image.format == "PNG" and image.size == (128, 128)


def test_the_banners_curl_hint_pasted_into_a_shell_queues_a_job(up, tmp_path):
    log = up.log_path.read_text()
    hint = log[log.index("curl -H") : log.index("/v1/jobs", log.index("curl -H")) + len("/v1/jobs")]
    hint = re.sub(r"\n\[up\] ", "\n", hint)  # as the terminal shows it, without the [up] prefix up adds

    result = subprocess.run(["bash", "-c", hint], env=child_env(), capture_output=True, text=True, timeout=30)

    assert result.returncode == 0, result
    job = json.loads(result.stdout)
    assert job["state"] == "queued", result.stdout
    saved = json.loads((up.var_dir / "stepwise.json").read_text())
    canceled = requests.post(  # a default-size job: leave the worker to the others (on a quiet machine it may be done)
        f"{saved['api_url']}/v1/jobs/{job['job_id']}/cancel",
        headers={"Authorization": f"Bearer {saved['api_key']}"},
        timeout=10,
    )
    assert canceled.status_code in (200, 202, 409), canceled.text


def test_celery_in_a_new_shell_finds_the_redis_of_the_running_up_and_says_so(up):
    celery = str(Path(sys.executable).with_name("celery"))
    log = up.log_path.read_text()
    hint = re.search(r"^\s+(\S.*celery -A worker inspect engine_stats)$", log, flags=re.M).group(1)
    pasted = subprocess.run(
        ["bash", "-c", hint.replace("celery", celery, 1)],
        cwd=up.workdir,
        env=child_env(),
        capture_output=True,
        text=True,
    )
    ping = subprocess.run(  # from up's folder, nothing exported: the state file of the running up
        [celery, "-A", "worker", "inspect", "ping", "--json", "-t", "10"],
        cwd=up.workdir,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert pasted.returncode == 0 and "num_running" in pasted.stdout, pasted.stdout + pasted.stderr
    assert ping.returncode == 0, ping.stdout + ping.stderr
    replies = json.loads(ping.stdout.strip().splitlines()[-1])
    assert any(node.startswith(f"up{up.process.pid}@") for node in replies), replies  # up's worker, not another's
    assert all(reply == {"ok": "pong"} for reply in replies.values()), replies
    said = (
        f"stepwise: Redis {up.redis_url} ({up.var_dir / 'stepwise.json'}, saved by `stepwise up`, pid {up.process.pid})"
    )
    assert said in ping.stderr


def api_call(up: UpProcess, method: str, path: str, **kwargs) -> dict:
    saved = json.loads((up.var_dir / "stepwise.json").read_text())
    response = requests.request(
        method, saved["api_url"] + path, headers={"Authorization": f"Bearer {saved['api_key']}"}, timeout=10, **kwargs
    )
    assert response.status_code < 300, response.text
    return response.json()


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
