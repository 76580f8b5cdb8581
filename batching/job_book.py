"""The book of jobs: every job the engine holds, what other threads ask of its loop, and the one exit.

All the state the engine's threads share is here, behind one lock (`cond`, which the idle loop
waits on):
- callers (`submit`, `cancel`, `pause`/`resume`, `shutdown`, `stats`) add jobs, end them and set flags;
- the loop thread takes the inbox and the samples of jobs that ended while scheduled, records each
  iteration's output (progress, failures, last steps) and publishes (stats snapshot, Future flags,
  resolutions);
- the decode worker hands decoded images over, and resolves a job whose last image is in at once.

A job moves from the inbox to scheduled to ended (`batching.job.Stage`) and leaves through one exit,
`_close`, whatever ends it: its last image (finished), a failed sample or an engine error (failed),
`cancel()` (canceled), a shutdown with abort or a loop that stopped (aborted). `_close` runs once per
job, under the lock: it drops the job from the maps (its later outputs and images are ignored), takes
it out of the inbox (it is never scheduled) or queues its samples for the loop to abort before its
next forward (`take_aborted`), counts it in the stats and hands back its Future's outcome. Outcomes are
resolved outside the lock: by the loop at `publish()` (after it has aborted the job's samples, so a
woken caller sees them gone from stats()), or at once by the decode worker for the job it completed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from batching.engine_stats import EngineStats
from batching.job import Ending, GenerationResult, Job, JobFuture, Stage
from batching.plan import RunnerOutput
from batching.previews import report_preview
from core.errors import EngineShutdownError, InvalidParamsError, JobCanceledError, JobFailedError

if TYPE_CHECKING:
    from batching.decoder import DecodeResult
    from batching.previews import PreviewPixels

logger = logging.getLogger(__name__)

SHUTDOWN_MESSAGE = "the engine shut down before the job finished"
Outcome = tuple[JobFuture, GenerationResult | Exception]  # a Future and what it resolves to


class JobBook:
    def __init__(self) -> None:
        self.cond = threading.Condition()  # reentrant; guards every attribute below
        self.stats = EngineStats()
        self.scheduler_snapshot: dict[str, Any] = {}  # the scheduler's counts as of the loop's last publish
        self.is_accepting = True  # submit() takes jobs
        self.is_stopping = False  # shutdown() was called: the loop exits once nothing is left
        self.is_pause_wanted = False  # pause(): the loop pauses the scheduler's admission at its next step
        self._jobs: dict[str, Job] = {}  # job_id -> job not ended
        self._job_of_sample: dict[str, Job] = {}  # sample_id -> its job, not ended
        self._inbox: list[Job] = []  # submitted, not yet taken by the loop (Stage.INBOX)
        self._aborted_sample_ids: list[str] = []  # samples of jobs that ended while scheduled, for the loop
        self._outcomes: list[Outcome] = []  # Futures of ended jobs, resolved at the loop's publish()

    # -- callers' threads ----------------------------------------------------------------------

    def add(self, job: Job) -> None:
        with self.cond:
            if not self.is_accepting:
                raise EngineShutdownError("the engine is shutting down and accepts no new jobs")
            if job.job_id in self._jobs or any(sample_id in self._job_of_sample for sample_id in job.sample_ids):
                raise InvalidParamsError("job_id", job.job_id, "is already used by an unfinished job")
            self._jobs[job.job_id] = job
            self._job_of_sample.update(dict.fromkeys(job.sample_ids, job))
            self._inbox.append(job)
            self.cond.notify_all()

    def cancel(self, future_or_id: Future | str) -> bool:
        with self.cond:
            job = self._find(future_or_id)
            if job is None:
                return False
            self.end(job, Ending.CANCELED, JobCanceledError(f"job {job.job_id} was canceled"))
            return True

    def set_pause(self, is_pause_wanted: bool) -> None:
        with self.cond:
            self.is_pause_wanted = is_pause_wanted
            self.cond.notify_all()

    def stop(self, *, abort: bool, reason: str | None = None) -> None:
        """Accept no more jobs; with `abort`, end every job now (aborted), else let the queued ones run."""
        with self.cond:
            self.is_accepting = False
            self.is_stopping = True
            if abort:
                self.end_all(Ending.ABORTED, EngineShutdownError(reason or SHUTDOWN_MESSAGE))
            else:
                self.is_pause_wanted = False  # a drain must admit what is already queued
            self.cond.notify_all()

    # -- any thread: the exit ------------------------------------------------------------------

    def end(self, job: Job, ending: Ending, error: Exception | None = None) -> bool:
        """End `job` unless it ended already; its Future resolves at the loop's next publish()."""
        with self.cond:
            outcome = self._close(job, ending, error)
            if outcome is None:
                return False
            self._outcomes.append(outcome)
            self.cond.notify_all()
            return True

    def end_all(self, ending: Ending, error: Exception, *, scheduled_only: bool = False) -> None:
        with self.cond:
            for job in list(self._jobs.values()):
                if not scheduled_only or job.stage is Stage.SCHEDULED:
                    self.end(job, ending, error)

    def _close(self, job: Job, ending: Ending, error: Exception | None) -> Outcome | None:
        """The one exit (caller holds the lock): None when the job had ended already."""
        if job.stage is Stage.ENDED:
            return None
        if job.stage is Stage.INBOX:
            self._inbox.remove(job)
        elif ending is not Ending.FINISHED:  # a finished job's samples have all left the scheduler
            self._aborted_sample_ids += job.sample_ids
        job.stage = Stage.ENDED
        del self._jobs[job.job_id]
        for sample_id in job.sample_ids:
            del self._job_of_sample[sample_id]
        self.stats.record_end(ending, len(job.samples))
        if ending is Ending.FINISHED:
            return job.future, job.result()
        assert error is not None, "only a finished job ends without an error"
        return job.future, error

    # -- the loop thread -----------------------------------------------------------------------

    def take_inbox(self) -> list[Job]:
        """The jobs submitted since the last call and not ended meanwhile, now scheduled."""
        with self.cond:
            jobs, self._inbox = self._inbox, []
            for job in jobs:
                job.stage = Stage.SCHEDULED
            return jobs

    def take_aborted(self) -> list[str]:
        """Samples of jobs that ended while scheduled, since the last call: the loop aborts them."""
        with self.cond:
            sample_ids, self._aborted_sample_ids = self._aborted_sample_ids, []
            return sample_ids

    def is_drained(self) -> bool:
        """shutdown() was called and the loop has taken everything (it checks its own parts too)."""
        with self.cond:
            return self.is_stopping and not (self._inbox or self._aborted_sample_ids)

    def record_iteration(self, output: RunnerOutput, seconds: float) -> None:
        with self.cond:
            self.stats.record(output, seconds)

    def set_snapshot(self, snapshot: dict[str, Any]) -> None:
        with self.cond:
            self.scheduler_snapshot = snapshot

    def record_output(
        self, output: RunnerOutput, previews: Iterable[tuple[str, PreviewPixels]], *, started_at: float
    ) -> None:
        """One iteration's results for jobs not ended: progress (then callbacks), previews, failures, last steps."""
        now = time.perf_counter()
        complete = []
        with self.cond:
            stepped = {job.job_id: job for job in self._jobs_of(output.stepped_sample_ids)}
            for job in stepped.values():
                job.admitted_at = job.admitted_at or started_at
                job.future.progress = job.progress()
            shown = [(owner, pixels) for sample_id, pixels in previews if (owner := self._job_of_sample.get(sample_id))]
            failed: dict[str, tuple[Job, str]] = {}  # job_id -> (job, its first failed sample's message)
            for sample_id, message in output.failed.items():
                if (owner := self._job_of_sample.get(sample_id)) is not None:
                    failed.setdefault(owner.job_id, (owner, message))
            for sample_id in output.denoised_sample_ids:
                if (owner := self._job_of_sample.get(sample_id)) is not None:
                    owner.denoised_at = now  # its last sample's last step ran in this iteration (decode comes after)
                    owner.num_samples_denoised += 1
                    if owner.is_complete:  # its images were decoded inline, or before the loop got here
                        complete.append(owner)
        for job in stepped.values():
            _report_progress(job)
        for job, pixels in shown:
            report_preview(job, pixels)
        for job, message in failed.values():
            self.end(job, Ending.FAILED, JobFailedError(message))
        for job in complete:
            self.end(job, Ending.FINISHED)

    def publish(
        self, snapshot: dict[str, Any], paused_sample_ids: Collection[str], late_sample_ids: Collection[str]
    ) -> None:
        """What stats() shows and the Futures' flags, then the ended jobs' Futures: a woken caller sees it current."""
        with self.cond:
            self.scheduler_snapshot = snapshot
            for job in self._jobs.values():  # plain attributes the job's caller reads (the worker writes them)
                job.future.is_paused = any(sample_id in paused_sample_ids for sample_id in job.sample_ids)
                job.future.is_late = any(sample_id in late_sample_ids for sample_id in job.sample_ids)
            outcomes, self._outcomes = self._outcomes, []
        _resolve(outcomes)

    def wait_for_work(self, is_busy: Callable[[], bool], timeout: float) -> None:
        with self.cond:
            if not (self._inbox or self._aborted_sample_ids or self._outcomes or self.is_stopping or is_busy()):
                self.cond.wait(timeout)

    # -- the decode worker (or the loop, decoding inline) --------------------------------------

    def take_images(self, result: DecodeResult) -> None:
        """A decoded batch, before the loop collects it: its images join their jobs, and a job whose every image
        is in and whose every last step the loop has seen resolves here at once (not a forward later)."""
        outcomes = []
        with self.cond:
            self.stats.record_decode(result)
            jobs = {job.job_id: job for job in self._jobs_of(result.images)}
            for sample_id, image in result.images.items():
                if (job := self._job_of_sample.get(sample_id)) is not None:  # not ended meanwhile
                    job.images[sample_id] = image
            for job in jobs.values():
                job.decode_seconds += result.seconds  # one batch per size, shared by its samples
                if job.is_complete and (outcome := self._close(job, Ending.FINISHED, None)) is not None:
                    outcomes.append(outcome)
        _resolve(outcomes)

    # -- reads ---------------------------------------------------------------------------------

    def _find(self, future_or_id: Future | str) -> Job | None:
        if isinstance(future_or_id, JobFuture):
            job = self._jobs.get(future_or_id.job_id)
            return job if job is not None and job.future is future_or_id else None
        if isinstance(future_or_id, Future):
            return None  # not one of this engine's
        return self._jobs.get(future_or_id) or self._job_of_sample.get(future_or_id)

    def _jobs_of(self, sample_ids: Iterable[str]) -> list[Job]:
        """The jobs (not ended) of these samples, each once, in order."""
        jobs = {job.job_id: job for sample_id in sample_ids if (job := self._job_of_sample.get(sample_id))}
        return list(jobs.values())


def _report_progress(job: Job) -> None:
    if job.on_progress is None:
        return
    progress = job.future.progress
    try:
        job.on_progress(progress.step, progress.total)
    except Exception:
        logger.exception("on_progress callback of job %s raised; ignored", job.job_id)


def _resolve(outcomes: list[Outcome]) -> None:
    for future, outcome in outcomes:
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
