"""The feeder: how a worker learns that there is work, and takes it.

The fair-share sorted sets in Redis are the one record of what is queued and in which order
(`storage.fair_share`). A worker takes its model's next job from them (`JobStore.take_next`, one
atomic script) whenever it may take more (`WorkerRuntime.may_take_jobs`: its engine runs and has
room, and it is neither draining nor shutting down), and runs each taken job on a thread of its own
(`worker.tasks.run_held_job`), held in the worker's book from the take on (`worker.held_jobs`: a job
this worker already runs, taken again after a re-queue behind its back, joins the attempt under way).
With nothing queued it blocks on its model's wake-up list (`JobStore.wait_for_work`), onto which the
script that queues a job (a new one, or a re-queue) pushes a token in the same step; a wait ends after
`WAKE_WAIT_SECONDS` anyway, so a wake-up lost to a Redis restart costs at most that. Without room it
waits for a job of its own to end.

So there is no second record to keep in line with the queue (no Celery message per job, no repair
loop), no broker hop between a job being queued and a worker taking it, and a job is taken by one
worker only (the take is atomic; its lease, held by one attempt, keeps it from running twice:
`worker.leases`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from storage.errors import StorageError
from storage.job_record import JobRecord
from worker.held_job import HeldJob
from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)

WAKE_WAIT_SECONDS = 1.0  # the longest an idle worker waits without looking at its queue
RETRY_SECONDS = 1.0  # after a failed take (Redis away)

RunHeldJob = Callable[[WorkerRuntime, HeldJob, JobRecord], object]  # runs one taken job to its end


class Feeder:
    def __init__(self, runtime: WorkerRuntime, run_held_job: RunHeldJob, wait_seconds: float = WAKE_WAIT_SECONDS):
        self.runtime = runtime
        self.run_held_job = run_held_job
        self.wait_seconds = wait_seconds
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepwise-feeder", daemon=True)

    def start(self) -> Feeder:
        self._thread.start()
        return self

    def _run(self) -> None:
        runtime = self.runtime
        while not self._stopped.is_set():
            if not runtime.may_take_jobs():
                runtime.room_changed.wait(self.wait_seconds)
                runtime.room_changed.clear()
                continue
            try:
                taken = runtime.job_store.take_next(runtime.settings.queue, runtime.worker_id, runtime.lease_seconds)
                if taken is None:
                    runtime.job_store.wait_for_work(runtime.settings.queue, self.wait_seconds)
                    continue
            except StorageError as e:
                log.warning("could not take a job (%s); trying again in %.0fs", e, RETRY_SECONDS)
                self._stopped.wait(RETRY_SECONDS)
                continue
            except Exception:  # the feeder must outlive any one failure
                log.exception("could not take a job; trying again in %.0fs", RETRY_SECONDS)
                self._stopped.wait(RETRY_SECONDS)
                continue
            held = runtime.held.take(taken)  # from here on its lease is renewed until it is let go
            if held is not None:  # None: it joined the attempt still running here
                self._start_job(held, taken)

    def _start_job(self, held: HeldJob, record: JobRecord) -> None:
        thread = threading.Thread(target=self._run_job, args=(held, record), name=f"stepwise-job-{record.job_id[:8]}")
        held.thread = thread
        thread.start()

    def _run_job(self, held: HeldJob, record: JobRecord) -> None:
        try:
            self.run_held_job(self.runtime, held, record)
        except Exception:  # run_held_job ends the job readably; this is for what it could not
            log.exception("job %s: its thread failed", record.job_id)

    def stop(self, timeout: float) -> None:
        """Take no more jobs, and wait up to `timeout` seconds for the jobs taken to end (at shutdown, the
        runtime has sent them back to the queue or let them finish by then)."""
        self._stopped.set()
        self.runtime.room_changed.set()
        self._thread.join(timeout=self.wait_seconds + 5)
        deadline = time.monotonic() + timeout
        for thread in self.runtime.held.threads():
            thread.join(max(0.0, deadline - time.monotonic()))
