"""One job a worker holds, from its take to its let-go (`worker.held_jobs` keeps them all): which attempt it is, the
holder token its writes carry, its stage, its thread, and, while the engine runs it, its engine future and what the
engine reports of it.

The engine calls `on_progress` and `on_preview` on its loop thread, so those methods only store what they get; the
job's thread reads it, encodes previews and does the Redis writes. Every other field is changed by the book, under
its lock.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from batching.job import JobProgress

if TYPE_CHECKING:
    from batching.job import JobFuture
    from batching.previews import Preview
    from worker.spool import SpooledJob

_NOT_SUBMITTED = JobProgress(step=0, total=0)
STEP_TIME_WEIGHT = 0.3  # of the newest step in seconds_per_step


class Stage(str, enum.Enum):
    TAKEN = "taken"  # its lease held; its parameters are being read (or it waits for an earlier attempt to go)
    IN_ENGINE = "in_engine"  # handed to the engine (or being handed over): it denoises, or waits there
    STORING = "storing"  # the engine is done with it: its outputs are encoded and stored
    SPOOLED = "spooled"  # its images wait in the spool for the image store (the spool's uploader holds it)
    ENDING = "ending"  # its end, re-queue or spooling is being written: no later take of it joins this attempt


RUNNING_STAGES = (Stage.TAKEN, Stage.IN_ENGINE, Stage.STORING, Stage.ENDING)  # a thread of its own runs it
ENGINE_STAGES = (Stage.TAKEN, Stage.IN_ENGINE)  # what a drain may still hand back at a step boundary


class StopReason(str, enum.Enum):
    CANCELED = "canceled"  # the client asked; the job ends `canceled`
    REQUEUE = "requeue"  # drain or warm shutdown; the job goes back to the queue for any worker
    LEASE_LOST = "lease_lost"  # this attempt no longer holds the job; it lets it go without a word


@dataclass(slots=True, eq=False)
class HeldJob:
    job_id: str
    attempt: int  # the job's attempt this worker runs (a take of it again here that joins this one moves it on)
    holder: str  # `worker_id#attempt` (storage.job_record.holder_token): every write as the job's holder carries it
    tenant: str = ""  # whose job (shown by `celery inspect active`)
    stage: Stage = Stage.TAKEN
    thread: threading.Thread | None = None  # the job's own thread; None while the spool's uploader holds it
    future: JobFuture | None = None  # the engine's, once submitted; its `progress` is the job's (read, never counted)
    stop_reason: StopReason | None = None
    spooled: SpooledJob | None = None  # what its spooled images are (Stage.SPOOLED)
    predecessor: HeldJob | None = None  # an earlier attempt here, stopping: this one enters the engine once it is gone
    is_let_go: threading.Event = field(default_factory=threading.Event)  # set when the book lets it go
    taken_at: float = field(default_factory=time.time)  # unix time this worker took this attempt
    submitted_at: float = 0.0  # monotonic time just before the engine's submit
    handed_over_at: float = 0.0  # the same moment, in unix time
    step_times: list[float] = field(default_factory=list)  # monotonic time of each step; drained by its thread
    seconds_per_step: float | None = None  # recent seconds per step of its progress (worker.drain estimates with it)
    paced_step: int = 0  # the progress step and monotonic time seconds_per_step was last measured at
    paced_at: float | None = None
    preview: Preview | None = None  # the newest live preview not yet written (the loop thread replaces it)

    @property
    def progress(self) -> JobProgress:
        """The job's progress in its own steps, as the engine derives it (all zero until submitted)."""
        return self.future.progress if self.future is not None else _NOT_SUBMITTED

    @property
    def step(self) -> int:
        return self.progress.step

    @property
    def total(self) -> int:
        """The job's step count (each of its images runs that many; not summed over them)."""
        return self.progress.total

    @property
    def has_started_denoising(self) -> bool:
        return self.progress.has_started

    def on_progress(self, step: int, total: int) -> None:
        now = time.monotonic()
        self.step_times.append(now)
        if self.paced_at is not None and step > self.paced_step:  # a moving mean: the batch it shares sets the pace
            sample = (now - self.paced_at) / (step - self.paced_step)
            previous = self.seconds_per_step
            self.seconds_per_step = sample if previous is None else previous + STEP_TIME_WEIGHT * (sample - previous)
        if self.paced_at is None or step > self.paced_step:
            self.paced_step, self.paced_at = step, now

    def on_preview(self, preview: Preview) -> None:
        self.preview = preview

    def seconds_to_finish(self) -> float | None:
        """Its remaining steps at its recent pace (its images one after another count as the job's mean step moves);
        None until that pace is measured."""
        if self.seconds_per_step is None:
            return None
        progress = self.progress
        return max(0, progress.total - progress.step) * self.seconds_per_step

    def take_preview(self) -> Preview | None:
        preview, self.preview = self.preview, None
        return preview

    def take_step_intervals(self) -> list[float]:
        """Seconds between consecutive steps reported since the last call."""
        times = self.step_times
        count = len(times)
        if count < 2:
            return []
        intervals = [times[i] - times[i - 1] for i in range(1, count)]
        del times[: count - 1]  # keep the last time: the next interval starts there
        return intervals
