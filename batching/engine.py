"""The diffusion engine: a loop thread that owns the model and steps every running job.

`submit()` may be called from any thread; it queues the job and returns a
`concurrent.futures.Future` at once. The loop thread runs `step()` (schedule ->
execute -> update) while there is work, and resolves futures as jobs finish. What the
threads share (the jobs, their inbox, the flags callers set, the stats) is the book's
(`batching.job_book`), behind one lock, and every way a job ends goes through its one
exit. New jobs and admission changes take effect at the next step boundary; a job that
ended (canceled, aborted) is never scheduled, and its scheduled samples are dropped
before the next group forward.

Callbacks (`on_progress`, `on_preview`, and a Future's done callbacks) run on the loop thread,
between two denoise steps of every running job, or (done callbacks of a job whose last
image was decoded beside the loop) on the decode worker: keep them cheap (hand heavy
work to another thread). An exception raised by `on_progress` is logged and ignored.
`on_progress(step, total)` counts the job's own steps (`batching.job.JobProgress`): a
2-image job of 200 steps goes to 200, not 400.
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

from batching.engine_config import (
    DECODE_OVERLAP_DEFAULT,
    ENCODE_OVERLAP_DEFAULT,
    FORWARD_CURVE_DEFAULT,
    EngineConfig,
)
from batching.forward_curve import ForwardCurve
from batching.job import Ending, Job, JobFuture, JobProgress, ProgressCallback
from batching.job_book import JobBook
from batching.previews import previews_wanted
from batching.sample import make_samples
from batching.scheduler import Scheduler
from batching.step_phases import NoPhases, Phases, StepPhases
from core.builtin_models import is_builtin
from core.errors import InvalidParamsError, JobFailedError, LoraError
from core.families import FAMILIES, FamilySpec
from core.image_inputs import input_images
from core.params import PRIORITIES, GenerationParams

if TYPE_CHECKING:
    from batching.lora.engine_loras import EngineLoras
    from batching.lora.store import LoraFetcher
    from batching.pipelines.contract import PipelineAdapter
    from batching.previews import PreviewCallback

logger = logging.getLogger(__name__)

IDLE_WAIT_SECONDS = 1.0
LOOP_THREAD_NAME = "stepwise-engine"


def serving_size(native: tuple[int, int], spec: FamilySpec, is_builtin: bool) -> tuple[int, int]:
    """(height, width) the engine sizes its default token budget and forward curve by: the model's native size,
    unless its pipeline states none (the adapter fell back to the family's small default size) for a checkpoint
    (not a built-in): then its family's first checkpoint size. Z-Image's pipeline picks 1024 inside its call;
    a budget at 128x128 would run every 1024x1024 job alone."""
    if is_builtin or native != (spec.default_size, spec.default_size) or not spec.checkpoint_sizes:
        return native
    return spec.checkpoint_sizes[0], spec.checkpoint_sizes[0]


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
        self._native_size = serving_size(model.native_size, FAMILIES[self.family], is_builtin(self.config.model))
        self.needs_init_image: bool | None = model.needs_init_image  # this model beyond its family (heartbeats say it)
        self.unusable_fields: frozenset[str] = model.unusable_fields  # its family's fields it cannot use (the same)
        self.book = JobBook()  # every job, the one exit, and all the state the threads share (batching.job_book)
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
        # Where each iteration's time goes (batching.step_phases), when the config asks: the GPU suite's profile.
        self.phases: Phases = StepPhases(model.device) if self.config.phase_timing else NoPhases()
        self.model_runner = ModelRunner(
            model,
            max_num_seqs=self.config.max_num_seqs,
            is_deterministic=self.config.deterministic,
            loras=self.loras,
            decode_overlap=decode_overlap,
            on_images=self.book.take_images,
            on_decoded=self._wake,
            encode_overlap=encode_overlap,
            on_encoded=self._wake,
            default_cache=self.config.cache,
            phases=self.phases,
            denoiser_compile=self.config.denoiser_compile,
        )
        self.forward_curve: ForwardCurve | None = None  # measured by the loop thread as it starts (_start_up)
        self.scheduler = self._new_scheduler()
        self.book.set_snapshot(self.scheduler.snapshot())
        self._loop_failure: str | None = None  # why the loop thread stopped, when it could not go on
        self._thread = threading.Thread(target=self._loop, name=LOOP_THREAD_NAME, daemon=True)
        self._thread.start()

    def _new_scheduler(self) -> Scheduler:
        """The scheduler of this engine's config, with the default token budget of the model it loaded unless the
        config sets one (at start, and again after an engine error dropped every sample)."""
        spec = FAMILIES[self.family]
        budget = self.config.max_num_tokens or spec.default_token_budget(self.config.max_num_seqs, self._native_size)
        return Scheduler(replace(self.config.scheduler_config, max_num_tokens=budget, forward_curve=self.forward_curve))

    def _measure_forward_curve(self) -> ForwardCurve | None:
        """The denoiser's forward time against its rows, when the config (or the device's default) asks for it;
        never in deterministic mode, whose forwards all carry the same padded rows."""
        runner = self.model_runner
        is_wanted = self.config.measure_forward_curve
        if is_wanted is None:
            is_wanted = FORWARD_CURVE_DEFAULT.get(runner.model.device.type, True)
        if not is_wanted or self.config.deterministic:
            return None
        from batching.forward_measure import measure_forward_curve

        return measure_forward_curve(
            runner.model,
            runner.encoder,
            self.config.max_num_seqs,
            size=self._native_size,
            warm_every_count=not runner.compiled,
        )

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
        future = JobFuture(job_id, JobProgress.of(samples))
        future.set_running_or_notify_cancel()  # Future.cancel() would bypass the engine: use engine.cancel()
        if params.lora is not None:
            try:
                assert self.loras is not None  # refused above otherwise
                self.loras.fetch(params.lora)  # on this thread: reading the store never stalls the loop
            except LoraError as e:
                future.set_exception(JobFailedError(str(e)))
                return future
        self.book.add(
            Job(
                job_id=job_id,
                params=params,
                samples=samples,
                future=future,
                on_progress=on_progress,
                submitted_at=time.perf_counter(),
                on_preview=on_preview if preview_every else None,
            )
        )
        return future

    def cancel(self, future_or_job_id: Future | str) -> bool:
        """Cancel a job: it ends now, and takes part in no denoiser forward after the one under way (or being
        started) when this returns; a job still in the inbox is never scheduled. False when it is unknown or
        already ended.

        Its Future then raises JobCanceledError (resolved by the loop thread, once the job's samples are gone
        from stats()). Takes the Future from submit(), its job id, or the id of one of its samples.
        """
        return self.book.cancel(future_or_job_id)

    def pause(self) -> None:
        """Stop admitting waiting samples (for a worker drain); running ones keep stepping."""
        self.book.set_pause(True)

    def resume(self) -> None:
        self.book.set_pause(False)

    def stats(self) -> dict:
        runner = self.model_runner
        with self.book.cond:
            return {
                "model": self.config.model,
                "family": self.family,
                "device": str(runner.model.device),
                "dtype": str(runner.model.dtype).removeprefix("torch."),
                "max_num_seqs": self.config.max_num_seqs,
                "is_deterministic": self.config.deterministic,
                "decode_overlap": runner.decoder.is_async,
                "encode_overlap": runner.encoder.is_async,
                **self.book.stats.as_dict(),
                "threads_failed": self._threads_failed(),
                "step_cache": self._step_cache_stats(),
                **(self.loras.stats() if self.loras else {}),
                **self.book.scheduler_snapshot,
                **({"phases": self.phases.summary()} if self.config.phase_timing else {}),
            }

    def _threads_failed(self) -> dict[str, str]:
        """The engine's threads that stopped (thread name -> why): the encode or decode worker (its work then
        runs on the loop) or the loop itself (the engine then takes no jobs). Empty while all is well."""
        stopped = {part.thread_name: part.stop_reason for part in self.model_runner.beside_the_loop}
        if self._loop_failure is not None:
            stopped[LOOP_THREAD_NAME] = self._loop_failure
        return {name: reason for name, reason in stopped.items() if reason is not None}

    def _step_cache_stats(self) -> dict:
        """Per family (this engine's one, when it has a step cache): block evaluations, and the fraction skipped."""
        if FAMILIES[self.family].step_cache is None:
            return {}
        stats = self.book.stats
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
        self.book.stop(abort=abort)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> DiffusionEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # -- the loop thread -------------------------------------------------------------------------

    def step(self) -> bool:
        """One iteration: schedule -> execute -> update. False when there was nothing to run."""
        phases = self.phases
        phases.begin_iteration()
        with phases.phase("schedule"):
            self._take_inbox()
            plan = self.scheduler.schedule()
        did_work = not plan.is_empty
        recorded = False  # whether the stats count this iteration; the phases count the same ones
        if did_work or self.model_runner.decoder.has_results():
            start = time.perf_counter()
            output = self.model_runner.execute(plan, self._abort_ended)
            with phases.phase("update"):
                self.scheduler.update_from_output(plan, output)
                if output.stepped_sample_ids:  # what the scheduler's slack estimates read
                    self.scheduler.step_times.observe(time.perf_counter() - start)
                self.book.set_snapshot(self.scheduler.snapshot())  # before a job resolves: its caller sees it gone
                # Only samples still being started were planned: nothing ran; the loop waits for the encoder.
                is_waiting = output.num_samples_starting > 0 and not (
                    output.rows_per_forward or output.failed or output.finished_sample_ids or plan.aborted_sample_ids
                )
                if not is_waiting:
                    self.book.record_iteration(output, time.perf_counter() - start)
                    recorded = True
                    if not output.rows_per_forward:  # no forward: its samples left (decoded, failed or aborted)
                        phases.mark_churn()
                self.book.record_output(output, self.model_runner.take_previews(), started_at=start)
                did_work = did_work and not is_waiting
                self._publish()
        else:
            self._publish()
        phases.end_iteration(recorded)
        return did_work

    def _start_up(self) -> None:
        """Before the first job (jobs submitted meanwhile wait in the inbox): measure the forward curve where
        wanted and admit by it. On this thread, which runs every forward after it (a compiled denoiser's CUDA
        graphs belong to the thread that records them)."""
        try:
            self.forward_curve = self._measure_forward_curve()
        except Exception:
            logger.exception("measuring the forward curve failed; admitting by the token budget alone")
        if self.forward_curve is not None:
            self.scheduler = self._new_scheduler()
            self.book.set_snapshot(self.scheduler.snapshot())

    def _loop(self) -> None:
        try:
            self._start_up()
            while not (self.book.is_drained() and not self._has_unfinished()):
                try:
                    did_work = self.step()
                except Exception as e:
                    logger.exception("engine step failed; failing every scheduled job and continuing")
                    self._recover(e)
                    did_work = False
                if not did_work:
                    self.book.wait_for_work(self._is_busy, IDLE_WAIT_SECONDS)
        except BaseException as e:  # the loop cannot go on: no job may wait for it
            logger.exception("the engine loop stopped")
            self._loop_failure = f"{type(e).__name__}: {e}"
        finally:  # nothing is left after a drain; after a stop, every job ends here
            reason = f"the engine loop stopped: {self._loop_failure}" if self._loop_failure else None
            self.book.stop(abort=True, reason=reason)
            try:
                self._publish()
            except Exception:
                logger.exception("the engine could not tidy up after its loop; resolving its jobs anyway")
                self.book.publish({}, (), ())
            self.model_runner.close()

    def _is_busy(self) -> bool:
        """Work the loop has to do beyond the book's: a change of pause, or results beside the loop."""
        runner = self.model_runner
        return (
            self.book.is_pause_wanted != self.scheduler.is_admission_paused
            or runner.decoder.has_results()
            or runner.encoder.has_results()
        )

    def _has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.model_runner.decoder.pending)

    def _wake(self) -> None:
        """Called by the decode and encode workers when images or started samples are ready: an idle loop
        collects them at once."""
        with self.book.cond:
            self.book.cond.notify_all()

    def _take_inbox(self) -> None:
        """Schedule the jobs submitted since the last step (not those ended meanwhile), and apply a pause."""
        for job in self.book.take_inbox():
            for sample in job.samples:
                self.scheduler.add(sample)
        self._abort_ended()
        if self.book.is_pause_wanted != self.scheduler.is_admission_paused:
            self.scheduler.pause_admission() if self.book.is_pause_wanted else self.scheduler.resume_admission()

    def _abort_ended(self) -> list[str]:
        """Abort the samples of jobs that ended since the last call (between two group forwards too): the ids,
        which the runner drops before its next forward."""
        sample_ids = self.book.take_aborted()
        for sample_id in sample_ids:
            self.scheduler.abort(sample_id)
        self.model_runner.decoder.discard(sample_ids)  # images still decoding are not the job's any more
        return sample_ids

    def _recover(self, error: Exception) -> None:
        """After an engine error: fail the scheduled jobs and start over with what was in the inbox."""
        self.book.end_all(
            Ending.FAILED, JobFailedError(f"engine error: {type(error).__name__}: {error}"), scheduled_only=True
        )
        self.book.take_aborted()  # the new scheduler and the reset runner never knew them
        self.scheduler = self._new_scheduler()
        self.model_runner.reset()
        self._publish()

    def _publish(self) -> None:
        """Abort what ended meanwhile, then refresh what stats() shows and resolve ended jobs' Futures."""
        self._abort_ended()
        scheduler = self.scheduler
        self.book.publish(scheduler.snapshot(), scheduler.paused_sample_ids(), scheduler.late_sample_ids())
