"""The diffusion engine: a loop thread that owns the model and steps every running job.

`submit()` may be called from any thread; it queues the request and returns a
`concurrent.futures.Future` at once. The loop thread runs `step()` (schedule ->
execute -> update) while there is work, and resolves futures as jobs finish. Requests,
cancellations and admission changes reach the loop through an inbox and take effect
at the next step boundary.

Callbacks (`on_progress`, and a Future's done callbacks) run on the loop thread,
between two denoise steps of every running job: keep them cheap (hand heavy work to
another thread). An exception raised by `on_progress` is logged and ignored.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass

from batching.engine_stats import EngineStats
from batching.errors import EngineShutdownError, InvalidParamsError, JobCanceledError, JobFailedError
from batching.params import PRIORITIES, CompatibilityKey, GenerationParams
from batching.plan import NewJob, RunnerOutput
from batching.request import ProgressCallback, Request, job_ids_for
from batching.scheduler import Scheduler, SchedulerConfig

logger = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "float16", "bfloat16")
IDLE_WAIT_SECONDS = 1.0


@dataclass(frozen=True)
class EngineConfig:
    model: str = "builtin:tiny"  # "builtin:tiny", "builtin:small", a diffusers folder, or a cached Hugging Face repo id
    device: str = "auto"  # "auto" (cuda when available), "cpu", "cuda", "cuda:N"
    dtype: str = "auto"  # "auto" (float16 on cuda, float32 on cpu), "float32", "float16", "bfloat16"
    max_num_seqs: int = 8  # running capacity in jobs; 1 = step-wise without batching
    policy: str = "default"  # admission policy: "default" or "fifo" (see batching.scheduler)
    max_num_groups: int = 2  # default policy: compatibility groups running at once
    max_wait_iterations: int = 50  # default policy: bound on how long a waiting job is passed over
    deterministic: bool = False  # fixed batch sizes everywhere: images bit-identical alone and batched
    num_threads: int | None = None  # torch CPU threads, process-wide; None keeps torch's default

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (got {self.dtype!r})")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N (got {self.device!r})")
        self.scheduler_config  # validates the scheduling fields now rather than at engine start

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            policy=self.policy,
            max_num_groups=self.max_num_groups,
            max_wait_iterations=self.max_wait_iterations,
        )


class DiffusionEngine:
    def __init__(self, config: EngineConfig | None = None) -> None:
        from batching.model_runner import ModelRunner
        from batching.pipelines import load_model

        self.config = config or EngineConfig()
        self.scheduler = Scheduler(self.config.scheduler_config)
        if self.config.num_threads:
            import torch

            torch.set_num_threads(self.config.num_threads)
        model = load_model(self.config.model, self.config.device, self.config.dtype)
        self.model_runner = ModelRunner(
            model, max_num_seqs=self.config.max_num_seqs, is_deterministic=self.config.deterministic
        )
        self._stats = EngineStats()
        self._scheduler_snapshot = self.scheduler.snapshot()
        self._requests: dict[str, Request] = {}  # request_id -> unfinished request
        self._request_of_job: dict[str, Request] = {}  # engine job_id -> its request
        self._inbox: list[Request] = []
        self._ended: list[tuple[Future, object]] = []  # loop thread only: futures to resolve at _publish()
        self._cancel_request_ids: list[str] = []
        self._is_pause_wanted = False
        self._is_accepting = True
        self._is_stopping = False
        self._is_abort_wanted = False
        self._cond = threading.Condition()  # guards everything above that other threads touch
        self._thread = threading.Thread(target=self._loop, name="stepwise-engine", daemon=True)
        self._thread.start()

    def submit(
        self, params: GenerationParams, *, job_id: str | None = None, on_progress: ProgressCallback | None = None,
        priority: str = "normal",
    ) -> Future:
        """Queue a request; the Future resolves to a GenerationResult or raises a BatchingError.

        `priority` (high, normal, low): the scheduler admits waiting jobs of a higher priority first."""
        if not isinstance(params, GenerationParams):
            raise TypeError(f"params must be GenerationParams, not {type(params).__name__}")
        params.validate()  # again: a params object altered after it was built allocates nothing either
        if params.model != self.config.model:
            raise InvalidParamsError("model", params.model, f"is not served by this engine, which serves {self.config.model!r}")
        if params.lora is not None:
            raise InvalidParamsError("lora", params.lora, "is not supported by this engine yet")
        if priority not in PRIORITIES:
            raise InvalidParamsError("priority", priority, f"must be one of {', '.join(PRIORITIES)}")
        request_id = job_id or uuid.uuid4().hex
        future: Future = Future()
        future.set_running_or_notify_cancel()  # Future.cancel() would bypass the engine: use engine.cancel()
        request = Request(
            request_id=request_id,
            params=params,
            future=future,
            job_ids=job_ids_for(request_id, params.num_images),
            on_progress=on_progress,
            submitted_at=time.perf_counter(),
            priority=priority,
        )
        with self._cond:
            if not self._is_accepting:
                raise EngineShutdownError("the engine is shutting down and accepts no new jobs")
            if request_id in self._requests:
                raise InvalidParamsError("job_id", request_id, "is already used by an unfinished job")
            self._requests[request_id] = request
            self._inbox.append(request)
            self._cond.notify()
        return future

    def cancel(self, future_or_job_id: Future | str) -> bool:
        """Cancel a request at the next step boundary; False when it is unknown or already done.

        Its Future then raises JobCanceledError. Takes the Future from submit() or its job id.
        """
        with self._cond:
            request = self._find_request(future_or_job_id)
            if request is None or request.future.done():
                return False
            self._cancel_request_ids.append(request.request_id)
            self._cond.notify()
            return True

    def pause(self) -> None:
        """Stop admitting waiting jobs (for a worker drain); running jobs keep stepping."""
        with self._cond:
            self._is_pause_wanted = True
            self._cond.notify()

    def resume(self) -> None:
        with self._cond:
            self._is_pause_wanted = False
            self._cond.notify()

    def stats(self) -> dict:
        with self._cond:
            return {
                "model": self.config.model,
                "device": str(self.model_runner.model.device),
                "dtype": str(self.model_runner.model.dtype).removeprefix("torch."),
                "max_num_seqs": self.config.max_num_seqs,
                "is_deterministic": self.config.deterministic,
                **self._stats.as_dict(),
                **self._scheduler_snapshot,
            }

    def shutdown(self, wait: bool = True, *, abort: bool = False) -> None:
        """Stop accepting jobs. By default finish every accepted job first (drain); with
        abort=True fail unfinished ones with EngineShutdownError at the next step boundary.
        wait=True blocks until the loop thread has exited."""
        with self._cond:
            self._is_accepting = False
            self._is_stopping = True
            self._is_abort_wanted = self._is_abort_wanted or abort
            if not abort:
                self._is_pause_wanted = False  # a drain must admit what is already queued
            self._cond.notify()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> DiffusionEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def step(self) -> bool:
        """One iteration: schedule -> execute -> update. False when there was nothing to run."""
        self._take_inbox()
        plan = self.scheduler.schedule()
        did_work = not plan.is_empty
        if did_work:
            start = time.perf_counter()
            output = self.model_runner.execute(plan)
            self.scheduler.update_from_output(plan, output)
            with self._cond:
                self._stats.record(plan, output, time.perf_counter() - start)
            self._resolve(output, started_at=start)
        self._publish()
        return did_work

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._is_stopping and not self._inbox and not self.scheduler.has_unfinished():
                    break
            try:
                did_work = self.step()
            except Exception as e:
                logger.exception("engine step failed; failing every unfinished job and continuing")
                self._recover(e)
                did_work = False
            if not did_work:
                with self._cond:
                    if not (self._inbox or self._cancel_request_ids or self._is_stopping):
                        self._cond.wait(IDLE_WAIT_SECONDS)
        self._fail_all(EngineShutdownError("the engine shut down before the job finished"))
        self._publish()

    def _take_inbox(self) -> None:
        with self._cond:
            new_requests, self._inbox = self._inbox, []
            cancel_ids, self._cancel_request_ids = self._cancel_request_ids, []
            is_pause_wanted, is_abort_wanted = self._is_pause_wanted, self._is_abort_wanted
        for request in new_requests:
            for index, job_id in enumerate(request.job_ids):
                params = request.params.for_image(index)
                self._request_of_job[job_id] = request
                self.scheduler.add(NewJob(job_id=job_id, params=params, key=CompatibilityKey.of(params)),
                                   priority=request.priority)
        for request_id in cancel_ids:
            with self._cond:
                request = self._requests.get(request_id)
            if request is not None:
                self._end(request, JobCanceledError(f"job {request_id} was canceled"), is_canceled=True)
        if is_abort_wanted:
            self._fail_all(EngineShutdownError("the engine shut down before the job finished"))
        if is_pause_wanted != self.scheduler.is_admission_paused:
            self.scheduler.pause_admission() if is_pause_wanted else self.scheduler.resume_admission()

    def _resolve(self, output: RunnerOutput, *, started_at: float) -> None:
        now = time.perf_counter()
        stepped: dict[str, Request] = {}
        for job_id in output.stepped_job_ids:
            request = self._request_of_job.get(job_id)
            if request is not None:
                request.admitted_at = request.admitted_at or started_at
                request.num_steps_done += 1
                stepped[request.request_id] = request
        for request in stepped.values():
            self._report_progress(request)
        for job_id, message in output.failed.items():
            request = self._request_of_job.get(job_id)
            if request is not None:
                self._end(request, JobFailedError(message))
        decoded: dict[str, Request] = {}
        for job_id in output.finished_job_ids:
            request = self._request_of_job.pop(job_id, None)
            if request is not None:
                request.images[job_id] = output.images[job_id]
                decoded[request.request_id] = request
        for request in decoded.values():
            request.decode_seconds += output.decode_seconds  # one decode call per iteration, shared
            if request.is_complete:
                request.denoised_at = now - output.decode_seconds
                self._end(request, None)

    def _end(self, request: Request, error: Exception | None, *, is_canceled: bool = False) -> None:
        """Finish a request, aborting its jobs still scheduled; its future resolves at _publish()."""
        num_aborted = sum(self.scheduler.abort(job_id) for job_id in request.job_ids)
        for job_id in request.job_ids:
            self._request_of_job.pop(job_id, None)
        with self._cond:
            self._requests.pop(request.request_id, None)
            if is_canceled:
                self._stats.num_jobs_canceled += num_aborted
        outcome = request.result() if error is None else error
        self._ended.append((request.future, outcome))

    def _report_progress(self, request: Request) -> None:
        if request.on_progress is None:
            return
        try:
            request.on_progress(request.num_steps_done, request.num_steps_total)
        except Exception:
            logger.exception("on_progress callback of job %s raised; ignored", request.request_id)

    def _fail_all(self, error: Exception) -> None:
        with self._cond:
            requests = list(self._requests.values())
        for request in requests:
            self._end(request, error)

    def _recover(self, error: Exception) -> None:
        self._fail_all(JobFailedError(f"engine error: {type(error).__name__}: {error}"))
        self.scheduler = Scheduler(self.config.scheduler_config)
        self._request_of_job.clear()
        self.model_runner.jobs.clear()
        self.model_runner.input_batches.clear()
        self._publish()

    def _publish(self) -> None:
        """Refresh what stats() shows, then resolve ended futures: a woken caller sees current stats."""
        snapshot = self.scheduler.snapshot()
        with self._cond:
            self._scheduler_snapshot = snapshot
        ended, self._ended = self._ended, []
        for future, outcome in ended:
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _find_request(self, future_or_job_id: Future | str) -> Request | None:
        if isinstance(future_or_job_id, Future):
            return next((r for r in self._requests.values() if r.future is future_or_job_id), None)
        return self._requests.get(future_or_job_id) or self._requests.get(future_or_job_id.rsplit("#", 1)[0])
