"""An engine stand-in whose steps take a known time, for in-process tests of the worker's own code (a drain's
decisions, a job taken again while it runs) that must not depend on how busy the machine is."""

from __future__ import annotations

import threading
import time

from PIL import Image

from batching.job import GenerationResult, JobFuture, JobProgress
from core.errors import JobCanceledError
from core.params import GenerationParams

STEP_SECONDS = 0.2


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
