"""What a worker knows about a job while the engine has it.

The engine calls `on_progress` and `on_preview` on its loop thread, so those methods only store
what they get; the job's task thread reads it, encodes previews and does the Redis writes.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from batching.job import JobProgress

if TYPE_CHECKING:
    from batching.job import JobFuture
    from batching.previews import Preview

_NOT_SUBMITTED = JobProgress(step=0, total=0)
STEP_TIME_WEIGHT = 0.3  # of the newest step in seconds_per_step


class StopReason(str, enum.Enum):
    CANCELED = "canceled"  # the client asked; the job ends `canceled`
    REQUEUE = "requeue"  # drain or warm shutdown; the job goes back to the queue for any worker
    LEASE_LOST = "lease_lost"  # another worker took the job over; this one lets it go silently


@dataclass(slots=True)
class ActiveJob:
    job_id: str
    tenant: str = ""  # whose job (shown by `celery inspect active`)
    future: JobFuture | None = None  # the engine's, once submitted; its `progress` is the job's (read, never counted)
    submitted_at: float = field(default_factory=time.monotonic)  # just before the engine's submit
    handed_over_at: float = field(default_factory=time.time)  # the same moment, in unix time
    step_times: list[float] = field(default_factory=list)  # monotonic time of each step; drained by the task thread
    stop_reason: StopReason | None = None
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
