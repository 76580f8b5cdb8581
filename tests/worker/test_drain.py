"""The drain at SIGTERM (worker.drain), decided from measured step times.

The worker's own code (task threads, runtime, drain, real Redis) runs in this process against an engine
whose steps take a known time, so which job fits in the drain does not depend on how busy the machine
is. The same through real worker processes and `stepwise up`: tests/worker/test_recovery.py and
tests/cli/test_up_drain.py.
"""

from __future__ import annotations

import threading
import time

import pytest
from PIL import Image

from batching.job import GenerationResult, JobFuture, JobProgress
from core.errors import JobCanceledError
from core.params import GenerationParams
from storage.job_record import JobState
from storage.job_store import JobStore
from storage.settings import StorageSettings
from tests.support.cluster import small_params
from tests.support.waiting import wait_for
from worker import tasks
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings

STEP_SECONDS = 0.2

pytestmark = pytest.mark.timeout(60)


class PacedEngine:
    """Stands in for DiffusionEngine: each job runs its num_inference_steps at STEP_SECONDS a step; a cancel
    takes effect at its next step boundary."""

    family = "sd"

    def __init__(self) -> None:
        self.canceled: set[str] = set()

    def submit(self, params: GenerationParams, *, job_id: str, on_progress, **_) -> JobFuture:
        future = JobFuture(job_id, JobProgress(0, params.num_inference_steps))
        threading.Thread(target=self._run, args=(future, params, job_id, on_progress), daemon=True).start()
        return future

    def _run(self, future: JobFuture, params: GenerationParams, job_id: str, on_progress) -> None:
        total = params.num_inference_steps
        for step in range(1, total + 1):
            time.sleep(STEP_SECONDS)
            future.progress = JobProgress(step, total, has_started=True)
            on_progress(step, total)
            if job_id in self.canceled:
                future.set_exception(JobCanceledError(f"job {job_id} was canceled"))
                return
        image = Image.new("RGB", (params.width, params.height))
        future.set_result(GenerationResult(job_id, [image], [params.seed], params, {"denoise": total * STEP_SECONDS}))

    def cancel(self, future_or_job_id: JobFuture | str) -> bool:
        """As DiffusionEngine.cancel: the job's future (what the worker passes) or its id."""
        self.canceled.add(getattr(future_or_job_id, "job_id", future_or_job_id))
        return True

    def pause(self) -> None:
        pass

    def stats(self) -> dict:
        return {}


@pytest.fixture
def runtime(redis_url, tmp_path):
    settings = WorkerSettings(
        storage=StorageSettings(redis_url=redis_url, storage_url=(tmp_path / "images").as_uri()),
        poll_interval=0.05,
        progress_interval=0.05,
        redis_retry_seconds=5,
        spool_dir=str(tmp_path / "spool"),
    )
    runtime = WorkerRuntime(settings, f"drain-worker-{time.monotonic_ns()}")
    runtime._engine = PacedEngine()
    yield runtime
    runtime.leases.stop()
    runtime.job_store.close()


def start(runtime: WorkerRuntime, store: JobStore, steps: int) -> tuple[str, list[str], threading.Thread]:
    """A job of `steps` steps, taken and run on a thread of its own as the feeder would."""
    record, _ = store.create(tenant="tests", params=small_params(prompt=f"{steps} steps", num_inference_steps=steps))
    outcome: list[str] = []
    task = threading.Thread(target=lambda: outcome.append(tasks.run_job(runtime)), daemon=True)
    task.start()
    wait_for(lambda: store.get(record.job_id).state is JobState.RUNNING, 10, "the job to start")
    return record.job_id, outcome, task


def test_sigterm_lets_a_job_that_will_finish_in_time_finish_and_hands_one_that_would_not_back_at_its_next_step(
    runtime, redis_url
):
    store = JobStore(redis_url)
    near_id, near_outcome, near_task = start(runtime, store, steps=12)  # about 2.4 s in all
    far_id, far_outcome, far_task = start(runtime, store, steps=100)  # about 20 s: past the drain
    wait_for(lambda: all(active.step >= 3 for active in runtime.active_jobs()), 10, "both to measure their pace")

    runtime.begin_shutdown(drain_seconds=8.0)
    far_task.join(10)
    near_task.join(10)

    assert (near_outcome, far_outcome) == (["succeeded"], ["requeued"])
    near, far = store.get(near_id), store.get(far_id)
    assert near.state is JobState.SUCCEEDED and near.attempts == 1
    assert far.state is JobState.QUEUED and far.attempts == 1 and far.requeue_reason == "worker_shutdown"
    assert far.requeued_at < near.finished_at  # handed back at once, not when the drain ran out
    wake_ups = store.redis.llen(store.keys.wake(far.queue))
    assert wake_ups == 3, "two creates and the hand-back woke the queue's workers: any worker takes it next"
    assert runtime.wait_until_idle(0) and not runtime.may_take_jobs()
    store.close()


def test_a_second_signal_hands_back_every_running_job_at_its_next_step(runtime, redis_url):
    store = JobStore(redis_url)
    job_id, outcome, task = start(runtime, store, steps=40)  # about 8 s: it fits in the drain
    wait_for(lambda: runtime.active_jobs()[0].step >= 3, 10, "the job to measure its pace")

    runtime.begin_shutdown(drain_seconds=60.0)
    active = runtime.active_jobs()[0]
    signaled_at_step = active.step
    wait_for(lambda: active.step >= signaled_at_step + 2, 10, "the job to run on after the first signal")
    assert active.stop_reason is None  # it fits in the drain
    runtime.begin_shutdown(drain_seconds=60.0)
    task.join(10)

    assert outcome == ["requeued"]
    record = store.get(job_id)
    assert record.state is JobState.QUEUED and record.progress_step == 0 and record.requeue_reason == "worker_shutdown"
    store.close()
