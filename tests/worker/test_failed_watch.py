"""A job whose task thread fails while it watches the engine (here: a preview that will not encode) ends
`failed`, and the engine stops computing it: it takes no more steps."""

from __future__ import annotations

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

NUM_STEPS = 200  # far more than the job takes before its first preview fails


@pytest.fixture
def runtime(redis_url, tmp_path):
    settings = WorkerSettings(
        storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()),
        poll_interval=0.02,
        preview_every=1,  # previews of every job, each step
    )
    runtime = WorkerRuntime(settings, "failed-watch-worker")
    runtime._engine = DiffusionEngine(EngineConfig(model="builtin:tiny", max_num_seqs=2, device="cpu"))
    yield runtime
    runtime.close()


def test_a_job_whose_preview_fails_to_encode_ends_failed_and_takes_no_more_steps(runtime, redis_url, monkeypatch):
    def broken_encoder(preview: Preview) -> str:
        raise OSError("preview encoder broke")

    monkeypatch.setattr(Preview, "data_uri", broken_encoder)
    store = JobStore(redis_url)
    params = small_params(num_inference_steps=NUM_STEPS, height=64, width=64)
    record, _ = store.create(tenant="tests", params=params)

    assert run_job(runtime, record.job_id) == "failed"

    ended = store.get(record.job_id)
    assert ended.state is JobState.FAILED and "preview encoder broke" in ended.error_message
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
