"""A job inside a very long denoise step: its lease holds, and a cancel ends it at the step's end.

The worker's own code (task, job watch, lease keeper, real Redis) runs in this process against an
engine whose steps take longer than the job's lease, which no real model here does reliably.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from batching.job import JobFuture, JobProgress
from core.errors import JobCanceledError
from storage.job_record import JobState
from storage.job_store import JobStore
from storage.settings import StorageSettings
from tests.support.cluster import small_params
from tests.support.waiting import wait_for
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings
from worker.tasks import run_job

LEASE_SECONDS = 1
STEP_SECONDS = 2.5  # each step outlasts the lease


class LongStepEngine:
    """Stands in for DiffusionEngine: every step takes STEP_SECONDS, a cancel takes effect at the
    next step boundary, and `cancel()` itself returns only then, as an engine whose lock is held
    through a forward would."""

    family = "sd"  # as DiffusionEngine.family: the worker publishes it in its heartbeats

    def __init__(self, num_steps: int) -> None:
        self.num_steps = num_steps
        self.is_cancel_wanted = threading.Event()
        self.at_boundary = threading.Event()

    def submit(
        self, params, *, job_id, on_progress, priority="normal", tenant="", complete_by=None, **previews
    ) -> JobFuture:
        future = JobFuture(job_id, JobProgress(0, self.num_steps))  # what DiffusionEngine.submit returns
        threading.Thread(target=self._run, args=(future, job_id, on_progress), daemon=True).start()
        return future

    def _run(self, future: Future, job_id: str, on_progress) -> None:
        for step in range(1, self.num_steps + 1):
            time.sleep(STEP_SECONDS)
            future.progress = JobProgress(step, self.num_steps, has_started=True)  # as the engine's loop does
            on_progress(step, self.num_steps)
            if self.is_cancel_wanted.is_set():
                self.at_boundary.set()
                future.set_exception(JobCanceledError(f"job {job_id} was canceled"))
                return
        future.set_exception(AssertionError("the job was never canceled"))

    def cancel(self, job_id: str) -> bool:
        self.is_cancel_wanted.set()
        self.at_boundary.wait(STEP_SECONDS * 3)
        return True


@pytest.fixture
def runtime(redis_url, tmp_path):
    settings = WorkerSettings(
        storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri(), job_lease_seconds=LEASE_SECONDS),
        poll_interval=0.05,
        progress_interval=0.05,
        redis_retry_seconds=5,
    )
    runtime = WorkerRuntime(settings, "long-step-worker")
    runtime._engine = LongStepEngine(num_steps=4)
    yield runtime
    runtime.leases.stop()
    runtime.job_store.close()


@pytest.mark.timeout(60)
def test_a_cancel_inside_a_step_longer_than_the_lease_ends_the_job_at_that_step_without_the_lease_lapsing(
    runtime, redis_url
):
    store = JobStore(redis_url)
    record, _ = store.create(tenant="tests", params=small_params(num_inference_steps=4))
    outcome: list[str] = []
    task = threading.Thread(target=lambda: outcome.append(run_job(runtime)), daemon=True)
    task.start()
    wait_for(lambda: store.get(record.job_id).state is JobState.RUNNING, 10, "the job to start")

    assert store.request_cancel(record.job_id) is JobState.RUNNING  # running: ends at the step boundary
    requested_at = time.monotonic()
    lapsed_while_running = []
    while task.is_alive() and time.monotonic() - requested_at < STEP_SECONDS * 4:
        if record.job_id in store.lapsed_job_ids():
            lapsed_while_running.append(round(time.monotonic() - requested_at, 2))
        time.sleep(0.1)
    task.join(5)

    ended = store.get(record.job_id)
    assert lapsed_while_running == [], f"the lease lapsed {lapsed_while_running[0]}s after the cancel request"
    assert outcome == ["canceled"]
    assert ended.state is JobState.CANCELED and ended.error_message == "canceled at step 1/4"
    assert ended.attempts == 1 and ended.finished_at - ended.started_at < STEP_SECONDS + 1.5
    store.close()
