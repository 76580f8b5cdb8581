"""What a job's thread does when something fails while it watches the engine, on a real runtime and engine in this
process: a preview that cannot be encoded costs that preview only (dropped and logged; the job succeeds, as the
engine's own rule for a preview it cannot make); a failure of the watch itself (here: a progress write that raises
what no storage outage does) ends the job `failed`, and the engine stops computing it: it takes no more steps."""

from __future__ import annotations

import logging

import pytest

from batching import DiffusionEngine, EngineConfig
from batching.previews import Preview
from core.params import GenerationParams
from storage.job_record import JobState
from storage.job_store import JobStore
from storage.settings import StorageSettings
from tests.support.cluster import small_params
from tests.support.waiting import wait_for
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings
from worker.tasks import run_job

NUM_STEPS = 200  # far more than the job takes before its first progress write fails


@pytest.fixture
def runtime(redis_url, tmp_path):
    settings = WorkerSettings(
        storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()),
        poll_interval=0.02,
        progress_interval=0.02,
        preview_every=1,  # previews of every job, each step
    )
    runtime = WorkerRuntime(settings, "failed-watch-worker")
    runtime._engine = DiffusionEngine(EngineConfig(model="builtin:tiny", max_num_seqs=2, device="cpu"))
    yield runtime
    runtime.close()


def test_a_preview_that_cannot_be_encoded_is_dropped_and_logged_and_the_job_succeeds(
    runtime, redis_url, monkeypatch, caplog
):
    def broken_encoder(preview: Preview) -> str:
        raise OSError("preview encoder broke")

    monkeypatch.setattr(Preview, "data_uri", broken_encoder)
    written: list[tuple] = []
    monkeypatch.setattr(runtime.job_store, "add_preview", lambda *args: written.append(args))
    store = JobStore(redis_url)
    record, _ = store.create(tenant="tests", params=small_params(num_inference_steps=6))

    with caplog.at_level(logging.WARNING, logger="worker.job_watch"):
        assert run_job(runtime) == "succeeded"

    ended = store.get(record.job_id)
    assert (ended.state, ended.error_code) == (JobState.SUCCEEDED, None) and len(ended.image_keys) == 1
    dropped = [r.getMessage() for r in caplog.records if "could not be encoded and was dropped" in r.getMessage()]
    assert dropped and all("preview encoder broke" in message for message in dropped)
    assert written == [], "no preview reached the job's event stream"
    store.close()


def test_a_job_whose_watch_fails_ends_failed_and_takes_no_more_steps(runtime, redis_url, monkeypatch):
    def broken_write(*args, **kwargs) -> None:
        raise ValueError("progress writer broke")

    store = JobStore(redis_url)
    monkeypatch.setattr(runtime.job_store, "set_progress", broken_write)
    params = small_params(num_inference_steps=NUM_STEPS, height=64, width=64)
    record, _ = store.create(tenant="tests", params=params)

    assert run_job(runtime) == "failed"

    ended = store.get(record.job_id)
    assert ended.state is JobState.FAILED and "progress writer broke" in ended.error_message
    engine = runtime.engine
    wait_for(lambda: engine.stats()["num_running"] == 0, 30, "the engine to drop the job")  # at its next step
    stats = engine.stats()
    assert stats["jobs_canceled"] == 1 and stats["num_waiting"] == 0, stats
    steps_at_end = stats["job_steps"]
    assert steps_at_end < NUM_STEPS
    engine.submit(GenerationParams(prompt="next", num_inference_steps=2, height=64, width=64)).result(
        60
    )  # one more job runs to its end after it
    assert engine.stats()["job_steps"] == steps_at_end + 2, "no step of the failed job since"
    store.close()
