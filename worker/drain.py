"""The drain at SIGTERM: finish what fits in `STEPWISE_DRAIN_SECONDS`, hand the rest back at a step boundary,
exit 0 before the supervisor's grace period ends.

A supervisor (Kubernetes, compose, `stepwise up`) stops a worker with SIGTERM and, a grace period
later, SIGKILL. On the first SIGTERM (or Ctrl+C) the worker:

1. takes no new job (admission stops, Celery stops consuming) and sends back the jobs that have not
   started denoising;
2. lets a running job go on while its measured pace (`HeldJob.seconds_to_finish`, plus FINISH_SECONDS
   for decode, encode and upload) says it ends before the deadline, less one of its steps and
   EXIT_SECONDS for handing back and exiting; any other job is stopped at its next step boundary and
   re-queued (`worker.job_ends.requeue`: `queued` again at the head of its queue, its attempt counted,
   reason `worker_shutdown`) for any worker. Every job is checked again each CHECK_SECONDS, so one that
   slows down is still handed back in time, and at the deadline nothing is left running;
3. exits 0 once no job it holds is before or in the engine (the jobs storing their outputs end first).

A second SIGTERM or SIGINT hands back every job still running at its next step. Jobs whose images wait in
the spool (worker.spool) stay there: a worker started on the same spool takes them over, else their lease
lapses and they run again.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from worker.held_job import HeldJob, StopReason

if TYPE_CHECKING:
    from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)

FINISH_SECONDS = 1.0  # after its last step: decode, encode, upload and the end state
EXIT_SECONDS = 2.0  # after the last hand-back: the re-queue writes and the process's own exit
CHECK_SECONDS = 0.2  # how often the running jobs are checked again


def will_finish_in_time(held: HeldJob, seconds_left: float) -> bool:
    """Whether the job, at its measured pace, ends with time to spare for handing it back otherwise."""
    seconds_to_finish = held.seconds_to_finish()
    margin = (held.seconds_per_step or 0.0) + EXIT_SECONDS  # its next step, then the exit
    if seconds_to_finish is None:  # its pace is not measured yet: give it time while there is plenty
        return seconds_left > 2 * margin + FINISH_SECONDS
    return seconds_to_finish + FINISH_SECONDS <= seconds_left - margin


class Drain:
    def __init__(self, runtime: WorkerRuntime, seconds: float) -> None:
        self.runtime = runtime
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self._thread = threading.Thread(target=self._run, name="stepwise-drain", daemon=True)

    def start(self) -> Drain:
        self._thread.start()
        return self

    def _run(self) -> None:
        runtime = self.runtime
        requeued = runtime.stop_admission()
        if requeued:
            log.info("drain: re-queued %d jobs that had not started", len(requeued))
        while True:
            handed_back = self.hand_back_what_will_not_finish()
            if handed_back:
                log.warning(
                    "drain: handing back %d jobs that would not finish within %.0fs: %s",
                    len(handed_back),
                    self.seconds,
                    ", ".join(handed_back),
                )
            if runtime.wait_until_idle(CHECK_SECONDS):
                log.info("drain: no job running; stopping")
                return

    def hand_back_what_will_not_finish(self) -> list[str]:
        """Stop, at their next step, the running jobs that would not end in time; returns their ids."""
        seconds_left = self.deadline - time.monotonic()
        handed_back = []
        for held in self.runtime.held.before_or_in_engine():
            if held.stop_reason is None and not will_finish_in_time(held, seconds_left):
                self.runtime.stop_job(held, StopReason.REQUEUE)
                handed_back.append(held.job_id)
        return handed_back
