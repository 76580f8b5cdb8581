"""Job leases: renew the ones this worker holds; re-queue jobs whose worker died.

A running job holds a lease that its worker's `LeaseKeeper` renews from a thread of its own,
never from the job's thread: that thread waits on the engine, and one long denoise step
(or a cancel waiting for that step to end) must not let the lease lapse and hand a job that
is still running to another worker. Each worker runs one `LapsedLeaseSweeper`: every
`STEPWISE_LEASE_SWEEP_INTERVAL` it asks the job store for running jobs whose lease lapsed and
moves each back to `queued` (only if the lease is still lapsed, so a worker that just renewed keeps
its job), which wakes its model's workers (`storage.lua.RELEASE`, `worker.feeder`). A SIGKILLed
worker's jobs therefore run again within about a lease; its dead-worker watch
(`worker.dead_workers`) usually re-queues them sooner, from heartbeats.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from storage.errors import StorageError
from storage.job_store import JobStore
from worker.dead_workers import DeadWorkerWatch
from worker.held_jobs import HeldJobs

log = logging.getLogger(__name__)

DEAD_WORKER_CHECK_SECONDS = 1.0


class LapsedLeaseSweeper:
    def __init__(
        self,
        job_store: JobStore,
        interval: float,
        dead_workers: DeadWorkerWatch | None = None,
        is_held_here: Callable[[str], bool] = lambda job_id: False,
    ) -> None:
        self.job_store = job_store
        self.interval = interval
        self.dead_workers = dead_workers  # checked every DEAD_WORKER_CHECK_SECONDS
        self.is_held_here = is_held_here  # job_id -> whether this worker holds it (renews its lease)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepwise-lease-sweeper", daemon=True)

    def start(self) -> LapsedLeaseSweeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        next_sweep = 0.0
        while not self._stopped.is_set():
            if self.dead_workers is not None:
                self._guarded("dead worker check", self.dead_workers.sweep)
            if time.monotonic() >= next_sweep:
                self._guarded("lease sweep", self.sweep)
                next_sweep = time.monotonic() + self.interval
            self._stopped.wait(min(self.interval, DEAD_WORKER_CHECK_SECONDS))

    def _guarded(self, what: str, *calls: Callable[[], object]) -> None:
        try:
            for call in calls:
                call()
        except StorageError as e:
            log.warning("%s failed (%s); trying again", what, e)
        except Exception:  # the sweeper must outlive any one bad record
            log.exception("%s failed", what)

    def sweep(self) -> list[str]:
        """Re-queue every job whose lease lapsed, except those this worker holds; returns their ids.

        This worker is alive (its sweeper runs), and its keeper renews what it holds without waiting on
        the engine, until the job's end is written: a lease of its own that lapsed was renewed late (a starved
        process, Redis away), not lost, and re-queueing it would only run the job again and throw this run away."""
        requeued = []
        for job_id in self.job_store.lapsed_job_ids():
            if self.is_held_here(job_id):
                log.info("job %s: its lease lapsed, but this worker holds it and renews it", job_id)
                continue
            if self.job_store.release_if_lapsed(job_id):  # wakes its queue's workers
                requeued.append(job_id)
                log.warning("job %s: its worker stopped renewing the lease; re-queued", job_id)
        return requeued


class LeaseKeeper:
    """Renews, every third of a lease, the lease of each job this worker holds (`worker.held_jobs`: from the take
    until its end or re-queue is written), each with its attempt's holder token. A renewal the store refuses means
    that attempt no longer holds the job (another process re-queued it, another worker took it): `on_lost(job_id,
    holder)` stops it here, unless the book took the job again meanwhile (its new attempt renews)."""

    def __init__(
        self, job_store: JobStore, held: HeldJobs, lease_seconds: float, on_lost: Callable[[str, str], None]
    ) -> None:
        self.job_store = job_store
        self.held = held
        self.lease_seconds = lease_seconds
        self.on_lost = on_lost
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepwise-lease-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stopped.wait(self.lease_seconds / 3):
            try:
                self.renew_all()
            except Exception:  # the keeper must outlive any one failure
                log.exception("lease renewal failed")

    def renew_all(self) -> None:
        for job_id, holder in self.held.holders():
            try:
                is_renewed = self.job_store.renew_lease(job_id, holder, self.lease_seconds)
            except StorageError as e:  # Redis away: try again at the next round, well within the lease
                log.warning("job %s: could not renew its lease (%s); retrying", job_id, e)
                continue
            if not is_renewed:
                self.on_lost(job_id, holder)
