"""The diffusion engine: a loop thread that owns the model and steps every running job.

`submit()` may be called from any thread; it queues the job and returns a
`concurrent.futures.Future` at once. The loop thread runs `step()` (schedule ->
execute -> update) while there is work, and resolves futures as jobs finish. New jobs
and admission changes reach the loop through an inbox and take effect at the next step
boundary; a cancel or an abort takes effect before the next group forward.

Callbacks (`on_progress`, `on_preview`, and a Future's done callbacks) run on the loop thread,
between two denoise steps of every running job, or (done callbacks of a job whose last
image was decoded beside the loop) on the decode worker: keep them cheap (hand heavy
work to another thread). An exception raised by `on_progress` is logged and ignored.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING

from batching.engine_config import DECODE_OVERLAP_DEFAULT, ENCODE_OVERLAP_DEFAULT, EngineConfig
from batching.engine_stats import EngineStats
from batching.job import Job, JobFuture, ProgressCallback
from batching.plan import RunnerOutput
from batching.previews import previews_wanted, report_preview
from batching.sample import make_samples
from batching.scheduler import Scheduler
from core.errors import EngineShutdownError, InvalidParamsError, JobCanceledError, JobFailedError, LoraError
from core.families import FAMILIES
from core.image_inputs import input_images
from core.params import PRIORITIES, GenerationParams

if TYPE_CHECKING:
    from batching.decoder import DecodeResult
    from batching.lora.engine_loras import EngineLoras
    from batching.lora.store import LoraFetcher
    from batching.pipelines.contract import PipelineAdapter
    from batching.previews import PreviewCallback, PreviewPixels

logger = logging.getLogger(__name__)

IDLE_WAIT_SECONDS = 1.0


class DiffusionEngine:
    def __init__(self, config: EngineConfig | None = None, *, lora_fetcher: LoraFetcher | None = None) -> None:
        """`lora_fetcher(key) -> bytes | None` reads a LoRA store the engine cannot read itself (the worker
        passes one for s3:// stores); `file://` stores need none."""
        from batching.model_loading import load_model
        from batching.model_runner import ModelRunner

        self.config = config or EngineConfig()
        if self.config.num_threads:
            import torch

            torch.set_num_threads(self.config.num_threads)
        model = load_model(self.config.model, self.config.device, self.config.dtype)
        self.family: str = model.family
        self.scheduler = self._new_scheduler()
        # Deterministic mode keeps the size in the key: a forward's padded shape must not depend on its company.
        self._key_has_size = self.config.deterministic or not FAMILIES[self.family].mixes_sizes
        self._key_has_lora = self.config.lora_mode == "group"
        self.loras = self._make_loras(model, lora_fetcher)
        decode_overlap = self.config.decode_overlap
        if decode_overlap is None:
            decode_overlap = DECODE_OVERLAP_DEFAULT.get(model.device.type, True)
        encode_overlap = self.config.encode_overlap
        if encode_overlap is None:
            encode_overlap = ENCODE_OVERLAP_DEFAULT.get(model.device.type, True)
        self.model_runner = ModelRunner(
            model,
            max_num_seqs=self.config.max_num_seqs,
            is_deterministic=self.config.deterministic,
            loras=self.loras,
            decode_overlap=decode_overlap,
            on_images=self._take_images,
            on_decoded=self._wake,
            encode_overlap=encode_overlap,
            on_encoded=self._wake,
            default_cache=self.config.cache,
        )
        self._stats = EngineStats()
        self._scheduler_snapshot = self.scheduler.snapshot()
        self._jobs: dict[str, Job] = {}  # job_id -> unfinished job
        self._job_of_sample: dict[str, Job] = {}  # sample_id -> its unfinished job
        self._inbox: list[Job] = []
        self._ended: list[tuple[Future, object]] = []  # loop thread only: futures to resolve at _publish()
        self._cancel_job_ids: list[str] = []
        self._is_pause_wanted = False
        self._is_accepting = True
        self._is_stopping = False
        self._is_abort_wanted = False
        self._cond = threading.Condition()  # guards everything above that other threads touch
        self._thread = threading.Thread(target=self._loop, name="stepwise-engine", daemon=True)
        self._thread.start()

    def _new_scheduler(self) -> Scheduler:
        """The scheduler of this engine's config, with the family's token budget unless the config sets one
        (at start, and again after an engine error dropped every sample)."""
        budget = self.config.max_num_tokens or FAMILIES[self.family].default_token_budget(self.config.max_num_seqs)
        return Scheduler(replace(self.config.scheduler_config, max_num_tokens=budget))

    def _make_loras(self, model: PipelineAdapter, lora_fetcher: LoraFetcher | None) -> EngineLoras | None:
        if not self.config.lora_url or not FAMILIES[self.family].supports_lora:
            return None
        from batching.lora.engine_loras import EngineLoras
        from batching.lora.store import LoraSource

        source = LoraSource(self.config.lora_url, fetcher=lora_fetcher, max_bytes=self.config.lora_max_bytes)
        return EngineLoras(
            source,
            model.pipeline,
            model.device,
            max_adapters=self.config.lora_cache_adapters,
            max_bytes=self.config.lora_cache_bytes,
        )

    def submit(
        self,
        params: GenerationParams,
        *,
        job_id: str | None = None,
        on_progress: ProgressCallback | None = None,
        priority: str = "normal",
        tenant: str = "",
        complete_by: float | None = None,
        preview_every: int = 0,
        on_preview: PreviewCallback | None = None,
    ) -> JobFuture:
        """Queue a job; the Future resolves to a GenerationResult or raises a BatchingError.

        `priority` (high, normal, low): the scheduler admits waiting samples of a higher priority first, and
        pauses running ones of a lower priority at a step boundary when there is no room. `complete_by` (unix
        seconds; may have passed already): among one priority, least slack first; the Future's `is_late` says
        when the job can no longer make it. `tenant`: among equals, tenants with fewer running samples first.
        `preview_every` (with `on_preview`): a `batching.previews.Preview` of the job's first image after every
        this many of its steps (not after its last), when the model has latent-to-RGB factors."""
        if not isinstance(params, GenerationParams):
            raise TypeError(f"params must be GenerationParams, not {type(params).__name__}")
        if params.model != self.config.model:
            raise InvalidParamsError(
                "model", params.model, f"is not served by this engine, which serves {self.config.model!r}"
            )
        # Again, against the family this engine loaded: a params object altered after it was built
        # allocates nothing either, and a folder model's family is known only here.
        params.validate(self.family)
        self.model_runner.model.check_params(params)  # what this model, beyond its family, cannot do
        if params.lora is not None and not FAMILIES[self.family].supports_lora:
            raise InvalidParamsError("lora", params.lora, f"is not supported for {self.family} models yet")
        # Decoded once, here on the caller's thread: an image that cannot be used is refused now, naming the field.
        images = input_images(params, self.family)
        if params.lora is not None and self.loras is None:
            raise InvalidParamsError("lora", params.lora, "needs a LoRA store (STEPWISE_LORA_URL), and none is set")
        if priority not in PRIORITIES:
            raise InvalidParamsError("priority", priority, f"must be one of {', '.join(PRIORITIES)}")
        if complete_by is not None and (
            isinstance(complete_by, bool) or not isinstance(complete_by, (int, float)) or not math.isfinite(complete_by)
        ):
            raise InvalidParamsError("complete_by", complete_by, "must be a time in unix seconds")
        preview_every = previews_wanted(preview_every, on_preview, self.model_runner.preview_maker)
        job_id = job_id or uuid.uuid4().hex
        samples = make_samples(
            job_id,
            params,
            FAMILIES[self.family],
            has_size=self._key_has_size,
            has_lora=self._key_has_lora,
            priority=priority,
            images=images,
            tenant=tenant,
            complete_by=None if complete_by is None else float(complete_by),
            preview_every=preview_every,
        )
        future = JobFuture(job_id, sum(sample.num_steps for sample in samples))
        future.set_running_or_notify_cancel()  # Future.cancel() would bypass the engine: use engine.cancel()
        if params.lora is not None:
            try:
                assert self.loras is not None  # refused above otherwise
                self.loras.fetch(params.lora)  # on this thread: reading the store never stalls the loop
            except LoraError as e:
                future.set_exception(JobFailedError(str(e)))
                return future
        job = Job(
            job_id=job_id,
            params=params,
            samples=samples,
            future=future,
            on_progress=on_progress,
            submitted_at=time.perf_counter(),
            on_preview=on_preview if preview_every else None,
        )
        with self._cond:
            if not self._is_accepting:
                raise EngineShutdownError("the engine is shutting down and accepts no new jobs")
            if job_id in self._jobs or any(sample_id in self._job_of_sample for sample_id in job.sample_ids):
                raise InvalidParamsError("job_id", job_id, "is already used by an unfinished job")
            self._jobs[job_id] = job
            self._job_of_sample.update(dict.fromkeys(job.sample_ids, job))
            self._inbox.append(job)
            self._cond.notify()
        return future

    def cancel(self, future_or_job_id: Future | str) -> bool:
        """Cancel a job before its next denoiser forward; False when it is unknown or already done.

        Its Future then raises JobCanceledError. Takes the Future from submit(), its job id,
        or the id of one of its samples.
        """
        with self._cond:
            job = self._find_job(future_or_job_id)
            if job is None or job.future.done():
                return False
            self._cancel_job_ids.append(job.job_id)
            self._cond.notify()
            return True

    def pause(self) -> None:
        """Stop admitting waiting samples (for a worker drain); running ones keep stepping."""
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
                "family": self.family,
                "device": str(self.model_runner.model.device),
                "dtype": str(self.model_runner.model.dtype).removeprefix("torch."),
                "max_num_seqs": self.config.max_num_seqs,
                "is_deterministic": self.config.deterministic,
                "decode_overlap": self.model_runner.decoder.is_async,
                "encode_overlap": self.model_runner.encoder.is_async,
                **self._stats.as_dict(),
                "step_cache": self._step_cache_stats(),
                **(self.loras.stats() if self.loras else {}),
                **self._scheduler_snapshot,
            }

    def _step_cache_stats(self) -> dict:
        """Per family (this engine's one, when it has a step cache): block evaluations, and the fraction skipped."""
        if FAMILIES[self.family].step_cache is None:
            return {}
        stats = self._stats
        fraction = stats.num_cache_blocks_skipped / stats.num_cache_blocks if stats.num_cache_blocks else 0.0
        return {
            self.family: {
                "blocks": stats.num_cache_blocks,
                "blocks_skipped": stats.num_cache_blocks_skipped,
                "skipped_fraction": round(fraction, 6),
                "steps_skipped": stats.num_cache_steps_skipped,
            }
        }

    def shutdown(self, wait: bool = True, *, abort: bool = False) -> None:
        """Stop accepting jobs. By default finish every accepted job first (drain); with
        abort=True fail unfinished ones with EngineShutdownError before the next forward.
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
        if did_work or self.model_runner.decoder.has_results():
            start = time.perf_counter()
            output = self.model_runner.execute(plan, self._take_cancels)
            self.scheduler.update_from_output(plan, output)
            if output.stepped_sample_ids:  # what the scheduler's slack estimates read
                self.scheduler.step_times.observe(time.perf_counter() - start)
            self._refresh_snapshot()  # before any job resolves: its caller sees its samples gone
            # Only samples still being started were planned: nothing ran; the loop waits for the encoder.
            is_waiting = output.num_samples_starting > 0 and not (
                output.rows_per_forward or output.failed or output.finished_sample_ids or plan.aborted_sample_ids
            )
            if not is_waiting:
                with self._cond:
                    self._stats.record(output, time.perf_counter() - start)
            self._resolve(output, self.model_runner.take_previews(), started_at=start)
            did_work = did_work and not is_waiting
        self._publish()
        return did_work

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._is_stopping and not self._inbox and not self._has_unfinished():
                    break
            try:
                did_work = self.step()
            except Exception as e:
                logger.exception("engine step failed; failing every unfinished job and continuing")
                self._recover(e)
                did_work = False
            if not did_work:
                with self._cond:
                    if not (
                        self._inbox
                        or self._cancel_job_ids
                        or self._is_stopping
                        or self.model_runner.decoder.has_results()
                        or self.model_runner.encoder.has_results()
                    ):
                        self._cond.wait(IDLE_WAIT_SECONDS)
        self._fail_all(EngineShutdownError("the engine shut down before the job finished"))
        self._publish()
        self.model_runner.close()

    def _has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.model_runner.decoder.num_pending > 0

    def _wake(self) -> None:
        """Called by the decode and encode workers when images or started samples are ready: an idle loop
        collects them at once."""
        with self._cond:
            self._cond.notify()

    def _take_inbox(self) -> None:
        with self._cond:
            new_jobs, self._inbox = self._inbox, []
            is_pause_wanted = self._is_pause_wanted
        for job in new_jobs:
            for sample in job.samples:
                self.scheduler.add(sample)
        self._take_cancels()
        if is_pause_wanted != self.scheduler.is_admission_paused:
            self.scheduler.pause_admission() if is_pause_wanted else self.scheduler.resume_admission()

    def _take_cancels(self) -> list[str]:
        """End canceled jobs (and every job on an abort); the ids of their samples that were scheduled."""
        with self._cond:
            cancel_ids, self._cancel_job_ids = self._cancel_job_ids, []
            is_abort_wanted = self._is_abort_wanted
            canceled = [self._jobs[job_id] for job_id in cancel_ids if job_id in self._jobs]
        aborted = []
        for job in canceled:
            aborted += self._end(job, JobCanceledError(f"job {job.job_id} was canceled"), is_canceled=True)
        if is_abort_wanted:
            aborted += self._fail_all(EngineShutdownError("the engine shut down before the job finished"))
        return aborted

    def _resolve(self, output: RunnerOutput, previews: list[tuple[str, PreviewPixels]], *, started_at: float) -> None:
        now = time.perf_counter()
        with self._cond:
            job_of_sample = dict(self._job_of_sample)  # only jobs not ended: late outputs are ignored
        stepped: dict[str, Job] = {}
        for sample_id in output.stepped_sample_ids:
            job = job_of_sample.get(sample_id)
            if job is not None:
                job.admitted_at = job.admitted_at or started_at
                job.num_steps_done += 1
                stepped[job.job_id] = job
        for job in stepped.values():
            self._report_progress(job)
        for sample_id, pixels in previews:
            if (job := job_of_sample.get(sample_id)) is not None:
                report_preview(job, pixels)
        failed: dict[str, Job] = {}
        for sample_id, message in output.failed.items():
            job = job_of_sample.get(sample_id)
            if job is not None and job.job_id not in failed:
                failed[job.job_id] = job
                self._end(job, JobFailedError(message))
        complete = []
        with self._cond:  # the decode worker adds images under this lock, and resolves a job the loop saw denoised
            for sample_id in output.denoised_sample_ids:
                job = self._job_of_sample.get(sample_id)
                if job is not None:
                    job.denoised_at = now  # its last sample's last step ran in this iteration (decode comes after)
                    job.num_samples_denoised += 1
                    if job.is_complete:  # its images were decoded inline, or before this loop got here
                        complete.append(job)
        for job in complete:
            self._end(job, None)

    def _take_images(self, result: DecodeResult) -> None:
        """A decoded batch, on the thread that decoded it (the decode worker, or the loop when decoding inline),
        before the loop collects it: its images join their jobs, and a job whose every image is in and whose
        every last step the loop has seen resolves here at once, instead of at the end of the loop's next
        iteration (a forward later)."""
        resolved = []
        with self._cond:
            self._stats.record_decode(result)
            jobs: dict[str, Job] = {}
            for sample_id, image in result.images.items():
                job = self._job_of_sample.get(sample_id)
                if job is not None:  # not canceled or failed meanwhile
                    job.images[sample_id] = image
                    self._stats.num_samples_finished += 1
                    jobs[job.job_id] = job
            for job in jobs.values():
                job.decode_seconds += result.seconds  # one batch per size, shared by its samples
                if job.is_complete:
                    self._forget(job)
                    resolved.append(job)
        for job in resolved:
            job.future.set_result(job.result())

    def _end(self, job: Job, error: Exception | None, *, is_canceled: bool = False) -> list[str]:
        """Finish a job (unless it ended meanwhile), aborting its samples still scheduled (returned); its future
        resolves at _publish(). Loop thread only."""
        with self._cond:
            if self._jobs.get(job.job_id) is not job:
                return []  # resolved by the decode worker, or ended already
            self._forget(job)
        aborted = [sample_id for sample_id in job.sample_ids if self.scheduler.abort(sample_id)]
        self.model_runner.decoder.discard(job.sample_ids)  # images still decoding are not the job's any more
        if is_canceled:
            with self._cond:
                self._stats.num_samples_canceled += len(aborted)
        outcome = job.result() if error is None else error
        self._ended.append((job.future, outcome))
        return aborted

    def _forget(self, job: Job) -> None:
        """Drop an ending job from the maps (caller holds the lock): its later outputs and images are ignored."""
        del self._jobs[job.job_id]
        for sample_id in job.sample_ids:
            self._job_of_sample.pop(sample_id, None)

    def _report_progress(self, job: Job) -> None:
        if job.on_progress is None:
            return
        try:
            job.on_progress(job.num_steps_done, job.num_steps_total)
        except Exception:
            logger.exception("on_progress callback of job %s raised; ignored", job.job_id)

    def _fail_all(self, error: Exception) -> list[str]:
        with self._cond:
            jobs = list(self._jobs.values())
        return [sample_id for job in jobs for sample_id in self._end(job, error)]

    def _recover(self, error: Exception) -> None:
        self._fail_all(JobFailedError(f"engine error: {type(error).__name__}: {error}"))
        self.scheduler = self._new_scheduler()
        self.model_runner.reset()
        self._publish()

    def _refresh_snapshot(self) -> None:
        snapshot = self.scheduler.snapshot()
        with self._cond:
            self._scheduler_snapshot = snapshot

    def _publish(self) -> None:
        """Refresh what stats() shows, then resolve ended futures: a woken caller sees current stats."""
        self._refresh_snapshot()
        paused, late = self.scheduler.paused_sample_ids(), self.scheduler.late_sample_ids()
        with self._cond:
            jobs = list(self._jobs.values())
        for job in jobs:  # plain attributes the job's caller reads (the worker writes them to the record)
            job.future.is_paused = any(sample_id in paused for sample_id in job.sample_ids)
            job.future.is_late = any(sample_id in late for sample_id in job.sample_ids)
        ended, self._ended = self._ended, []
        for future, outcome in ended:
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _find_job(self, future_or_id: Future | str) -> Job | None:
        if isinstance(future_or_id, JobFuture):
            job = self._jobs.get(future_or_id.job_id)
            return job if job is not None and job.future is future_or_id else None
        if isinstance(future_or_id, Future):
            return None  # not one of this engine's
        return self._jobs.get(future_or_id) or self._job_of_sample.get(future_or_id)
