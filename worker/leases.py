"""Re-queue jobs whose worker died, and send jobs whose creator died before sending them.

A running job holds a lease that its task thread renews (`worker.job_watch`). Each worker
runs one `LapsedLeaseSweeper`: every `STEPWISE_LEASE_SWEEP_INTERVAL` it asks the job store
for running jobs whose lease lapsed, moves each back to `queued` (only if the lease is still
lapsed, so a worker that just renewed keeps its job) and sends a new generate message. A
SIGKILLed worker's jobs therefore run again within about a lease, not after the broker's
visibility timeout; when the original message does come back, the job is no longer queued
under it and that delivery does nothing.

The same sweep sends a message for each job that has stayed queued longer than a lease without
its creator confirming the message was sent (`JobStore.unsent_job_ids`): an API process that died
between storing the record and sending the message would otherwise leave the job queued forever.
A message sent twice is harmless: only one delivery can take the job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from storage.errors import StorageError
from storage.job_record import JobRecord, JobState
from storage.job_store import JobStore

log = logging.getLogger(__name__)


class LapsedLeaseSweeper:
    def __init__(self, job_store: JobStore, enqueue: Callable[[JobRecord], None], interval: float,
                 unsent_grace: float) -> None:
        self.job_store = job_store
        self.enqueue = enqueue
        self.interval = interval
        self.unsent_grace = unsent_grace  # seconds a creator has to send a new job's message
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepwise-lease-sweeper", daemon=True)

    def start(self) -> LapsedLeaseSweeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.sweep()
                self.send_unsent()
            except StorageError as e:
                log.warning("lease sweep failed (%s); trying again in %.0fs", e, self.interval)
            except Exception:  # the sweeper must outlive any one bad record
                log.exception("lease sweep failed")
            self._stopped.wait(self.interval)

    def sweep(self) -> list[str]:
        """Re-queue every job whose lease lapsed; returns their ids."""
        requeued = []
        for job_id in self.job_store.lapsed_job_ids():
            if self.job_store.release_if_lapsed(job_id):
                record = self.job_store.get(job_id)
                if record is None:
                    continue
                self.enqueue(record)  # to the job's own queue, at its priority
                requeued.append(job_id)
                log.warning("job %s: its worker stopped renewing the lease; re-queued", job_id)
        return requeued

    def send_unsent(self) -> list[str]:
        """Send a message for every job still queued whose creator never confirmed sending one."""
        sent = []
        for job_id in self.job_store.unsent_job_ids(self.job_store.clock() - self.unsent_grace):
            record = self.job_store.get(job_id)
            if record is not None and record.state is JobState.QUEUED:
                self.enqueue(record)
                sent.append(job_id)
                log.warning("job %s: queued for %.0fs with no message sent; sent one", job_id, self.unsent_grace)
            self.job_store.mark_sent(job_id)
        return sent
