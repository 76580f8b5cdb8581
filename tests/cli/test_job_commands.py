"""The CLI against the real API served in this process (werkzeug on loopback, real Redis, no worker):
submit's options, status/cancel/jobs, backfill's progress counters; and generate's one-line device errors."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tqdm import tqdm
from werkzeug.serving import make_server

from api import create_app
from api.settings import ApiSettings
from stepwise_cli.backfill import Backfill, Manifest, read_rows
from stepwise_cli.client import ApiTarget
from stepwise_cli.main import main
from storage.job_store import JobState
from storage.settings import StorageSettings
from storage.url_policy import AllowList
from tests.support.job_factories import take_job
from tests.support.servers import free_port

KEY = "sk_cli_test_key_0123456789abcdef"


class LiveApi:
    def __init__(self, redis_url: str, images: Path) -> None:
        settings = ApiSettings(
            api_keys=(("local", KEY),),
            webhook_allow=AllowList.parse("127.0.0.1"),
            storage=StorageSettings(redis_url=redis_url, storage_url=images.as_uri()),
            accept_unserved_models=True,  # no worker here: jobs queue, as for an autoscaled fleet
        )
        self.app = create_app({"API_SETTINGS": settings})
        self.server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.store = self.app.extensions["stepwise.job_store"]

    def cli(self, *argv: str) -> int:
        return main([*argv, "--api-url", self.url, "--api-key", KEY])

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture
def live_api(redis_url, tmp_path):
    api = LiveApi(redis_url, tmp_path / "images")
    yield api
    api.close()


def submit_json(api: LiveApi, capsys, *argv: str) -> dict:
    assert api.cli("submit", *argv, "--json") == 0
    return json.loads(capsys.readouterr().out)


def test_submit_sends_height_width_webhook_and_deadline(live_api, capsys):
    job = submit_json(
        live_api,
        capsys,
        "a fox",
        "--height",
        "64",
        "--width",
        "96",
        "--steps",
        "3",
        "--webhook-url",
        "http://127.0.0.1:9/hook",
        "--webhook-events",
        "completed,failed",
        "--deadline",
        "10m",
    )

    assert (job["params"]["height"], job["params"]["width"]) == (64, 96)
    assert job["webhook"]["url"] == "http://127.0.0.1:9/hook"
    assert job["webhook"]["events"] == ["completed", "failed"]
    seconds_left = datetime.fromisoformat(job["deadline"].replace("Z", "+00:00")) - datetime.now(UTC)
    assert 540 < seconds_left.total_seconds() <= 600
    assert submit_json(live_api, capsys, "a fox", "--size", "128x64")["params"]["width"] == 128


def test_submit_refuses_a_deadline_it_cannot_read_in_one_line(live_api, capsys):
    with pytest.raises(SystemExit) as raised:
        live_api.cli("submit", "a fox", "--deadline", "tomorrow")
    assert raised.value.code == 2
    assert "--deadline" in capsys.readouterr().err


def test_status_shows_a_multi_image_jobs_own_steps_and_the_image_it_is_on(live_api, capsys):
    job_id = submit_json(live_api, capsys, "a red fox", "--num-images", "2", "--steps", "8")["job_id"]
    assert live_api.cli("status", job_id) == 0
    assert capsys.readouterr().out.startswith(f"{job_id}  queued  step 0/8\n"), "its own steps, not 16"

    take_job(live_api.store, job_id, "fake-worker")
    live_api.store.set_progress(job_id, 5, 8, current_image=2)  # its images run one after another
    assert live_api.cli("status", job_id) == 0
    assert capsys.readouterr().out.startswith(f"{job_id}  running  step 5/8, image 2 of 2\n")


def test_status_shows_a_videos_frame_count_and_frame_rate(live_api, capsys):
    job_id = submit_json(
        live_api, capsys, "a red fox running", "--model", "builtin:tiny-wan", "--num-frames", "9", "--fps", "8"
    )["job_id"]

    assert live_api.cli("status", job_id) == 0
    assert ", 9 frames at 8 fps, " in capsys.readouterr().out


@pytest.mark.parametrize("command", [["jobs"], ["status", "some-job"], ["cancel", "some-job"]])
def test_status_jobs_and_cancel_say_at_once_that_no_api_answers(capsys, command):
    closed_port = free_port()  # nothing listens there
    started = time.monotonic()

    status = main([*command, "--api-url", f"http://127.0.0.1:{closed_port}", "--api-key", KEY])

    assert status == 2 and time.monotonic() - started < 3
    said = capsys.readouterr().err.strip()
    assert said == (
        f"stepwise {command[0]}: no API answers at http://127.0.0.1:{closed_port} (connection refused): "
        "is `stepwise up` running?"
    )


def test_status_cancel_and_jobs_cover_the_api(live_api, capsys):
    first = submit_json(live_api, capsys, "first fox")["job_id"]
    second = submit_json(live_api, capsys, "second fox")["job_id"]

    assert live_api.cli("jobs") == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed[:2]] == [second, first]  # newest first

    assert live_api.cli("status", first) == 0
    assert capsys.readouterr().out.startswith(f"{first}  queued  step 0/20")

    assert live_api.cli("cancel", first) == 0
    assert capsys.readouterr().out.strip() == f"{first} canceled"

    assert live_api.cli("status", first) == 1  # the job did not succeed
    out = capsys.readouterr().out
    assert "canceled" in out and "error: the job was canceled" in out

    assert live_api.cli("cancel", first) == 1
    assert capsys.readouterr().err.strip() == "stepwise cancel: the job was already canceled; nothing to cancel"
    take_job(live_api.store, second, "a-worker")
    live_api.store.finish(second, JobState.SUCCEEDED, image_keys=[f"{second}/0.png"])
    assert live_api.cli("cancel", second) == 1
    assert capsys.readouterr().err.strip() == "stepwise cancel: the job already succeeded; nothing to cancel"

    assert live_api.cli("jobs", "--state", "canceled", "--json") == 0
    assert [json.loads(line)["job_id"] for line in capsys.readouterr().out.splitlines()] == [first]

    assert live_api.cli("status", "no-such-job") == 2
    assert capsys.readouterr().err.strip() == "stepwise status: job not found"


def test_submit_and_status_say_when_the_prompt_is_outside_what_the_model_knows(live_api, capsys):
    assert live_api.cli("submit", "a watercolor of a fox", "--model", "builtin:shapes") == 0
    submitted = capsys.readouterr()
    job_id = submitted.out.split()[0]
    assert "stepwise submit: note: the prompt is outside what builtin:shapes knows" in submitted.err

    assert live_api.cli("status", job_id) == 0
    assert "  note: the prompt is outside what builtin:shapes knows" in capsys.readouterr().out


def finish_jobs_as_a_worker_would(api: LiveApi, num_jobs: int, fail_prompt: str, stop: threading.Event) -> None:
    done: set[str] = set()
    while len(done) < num_jobs and not stop.is_set():
        records, _ = api.store.list_for_tenant("local", state=JobState.QUEUED, limit=100)
        for queue in {record.queue for record in records}:
            while (taken := api.store.take_next(queue, "fake-worker", 60)) is not None:
                if taken.params["prompt"] == fail_prompt:
                    api.store.finish(taken.job_id, JobState.FAILED, error_code="engine_error", error_message="boom")
                else:
                    api.store.finish(taken.job_id, JobState.SUCCEEDED, image_keys=[f"{taken.job_id}/0.png"])
                done.add(taken.job_id)
        time.sleep(0.05)


def test_backfill_progress_bar_ends_with_the_counts_of_its_summary(live_api, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"fox {i}", "num_inference_steps": 2}) + "\n" for i in range(4)) + "{broken\n"
    )
    rows = read_rows(prompts, None)
    shown = io.StringIO()
    bar = tqdm(total=len(rows), file=shown, disable=False, mininterval=0)
    backfill = Backfill(
        ApiTarget(live_api.url, KEY),
        retry_seconds=5,
        run_name="counts",
        out_dir=None,
        concurrency=2,
        manifest=Manifest(tmp_path / "manifest.jsonl"),
        bar=bar,
    )
    stop = threading.Event()
    worker = threading.Thread(target=finish_jobs_as_a_worker_would, args=(live_api, 4, "fox 2", stop))
    worker.start()
    try:
        results = backfill.run(rows, timeout=60)
    finally:
        stop.set()
        worker.join(10)
        backfill.client.close()
        backfill.manifest.close()
    bar.close()

    assert sorted((r.line, r.state) for r in results) == [
        (1, "succeeded"),
        (2, "succeeded"),
        (3, "failed"),
        (4, "succeeded"),
        (5, "invalid"),
    ]
    last_frame = shown.getvalue().split("\r")[-1]
    assert "ok=3, failed=2, in_flight=0" in last_frame, last_frame
    manifest = [json.loads(line) for line in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    assert all(isinstance(entry["images"], list) for entry in manifest)
    assert {len(entry["images"]) for entry in manifest if entry["state"] == "succeeded"} == {1}


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda"])
def test_generate_with_a_device_it_cannot_use_exits_2_with_one_line(tmp_path, capsys, device):
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA: `--device cuda` is valid here")
    code = main(["generate", "--prompt", "a fox", "--device", device, "--out", str(tmp_path / "x.png")])

    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("stepwise generate: error: --device: ")
    assert ("no usable CUDA device" in err) if device == "cuda" else ("auto, cpu, cuda or cuda:N" in err)


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--version"])
    assert raised.value.code == 0
    assert capsys.readouterr().out.startswith("stepwise ")


def test_bench_does_not_write_over_the_committed_results_unless_asked():
    import argparse

    from stepwise_cli import bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    committed = (Path(__file__).parents[2] / "benchmarks" / "results").resolve()
    assert bench.results_folder(parser.parse_args([]).out).resolve() != committed
    assert bench.results_folder(parser.parse_args(["--out", "benchmarks/results"]).out) == Path("benchmarks/results")
