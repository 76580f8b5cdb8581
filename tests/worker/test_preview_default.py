"""A worker's STEPWISE_PREVIEW_EVERY is the previews of jobs that give no `preview_every` (the end-to-end stream of
previews is tests/api/test_live_end_to_end.py's)."""

from __future__ import annotations

import pytest

from batching.job import JobFuture, JobProgress
from core.params import GenerationParams
from storage.settings import StorageSettings
from tests.support.held_jobs import hold
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings


class SubmitRecorder:
    """Stands in for DiffusionEngine: records what each submit asked for."""

    family = "sd"

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def submit(self, params, *, job_id, **options) -> JobFuture:
        self.calls.append(options)
        return JobFuture(job_id, JobProgress(0, params.num_inference_steps))


@pytest.fixture
def runtime(redis_url, tmp_path):
    settings = WorkerSettings(
        storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()), preview_every=3
    )
    runtime = WorkerRuntime(settings, "preview-default-worker")
    runtime._engine = SubmitRecorder()  # type: ignore[assignment]
    yield runtime
    runtime.leases.stop()
    runtime.job_store.close()


@pytest.mark.parametrize(("asked", "made"), [(None, 3), (0, 0), (5, 5)])
def test_a_job_without_preview_every_gets_the_workers_and_one_with_it_its_own(runtime, asked, made):
    params = GenerationParams(prompt="a red fox", height=64, width=64, num_inference_steps=4, seed=1)

    held = hold(runtime, f"job-{asked}")

    assert runtime.submit(held, params, preview_every=asked)

    (call,) = runtime._engine.calls
    assert call["preview_every"] == made and call["on_preview"] == held.on_preview
