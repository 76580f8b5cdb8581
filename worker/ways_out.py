"""The ways a taken job leaves its straight line (`worker.tasks.run_taken_job`).

A step that finds the job cannot go on raises one of these; `worker.tasks.run_held_job` acts on it, once,
whichever step raised it. The straight line's own end, success, is an `Ends` too, returned, not raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from storage.job_record import JobState
from worker.output_images import OutputImage
from worker.spool import SpooledJob


class WayOut(Exception):
    """How a taken job leaves its straight line."""


@dataclass(eq=False)
class Ends(WayOut):
    """The job ends in `state`, its record given `fields` (its error, or its images and timings)."""

    state: JobState
    fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(cls, error_code: str, error_message: str) -> Ends:
        return cls(JobState.FAILED, {"error_code": error_code, "error_message": error_message})


@dataclass(eq=False)
class BackToQueue(WayOut):
    """A drain, warm shutdown or stopping engine: the job goes back to its queue for any worker."""

    why: str


@dataclass(eq=False)
class LeaseLost(WayOut):
    """Another worker holds the job now: this one lets it go without a word."""


@dataclass(eq=False)
class WaitsInSpool(WayOut):
    """The image store failed: the job stays running, its images in this worker's spool (`worker.spool`)."""

    spooled: SpooledJob
    images: list[OutputImage]
    why: str


@dataclass(eq=False)
class LeftToLease(WayOut):
    """Redis stayed away past the task's retries: the job's lease lapses and a lease sweeper re-queues it."""

    why: str
