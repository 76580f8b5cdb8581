"""The thread that empties the spool (worker.spool): uploads its jobs' images once the store answers, and
ends each job.

It tries the oldest job first, then the others several at a time; while the store fails it tries
again after a backoff (RETRY_FIRST_WAIT, doubling up to RETRY_MAX_WAIT, so a job is stored within about
that long of the store answering again) and updates the job's `storing` reason when it changes. There
is no cap on how long it keeps trying but the job's own retention (`STEPWISE_JOB_TTL`): a job spooled
longer than that fails `storage_unavailable`.

Before uploading it reads the job's record: a job that ended (deleted, canceled meanwhile by its
retention) or that another worker now holds (this one lost its lease, and the job runs again there)
is dropped here, not stored, so a job never ends twice. Jobs a stopped worker left in a shared
spool are taken over first (`JobStore.adopt`), at start and every ADOPT_INTERVAL; as often, waiting jobs
that ended meanwhile are dropped (`drop_ended`), so a deleted job holds no room through a long outage.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from storage.errors import StorageError
from storage.job_record import JobState
from worker import metrics
from worker.output_images import put_images
from worker.spool import SpooledJob

if TYPE_CHECKING:
    from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)

RETRY_FIRST_WAIT = 0.5  # seconds
RETRY_MAX_WAIT = 10.0  # seconds: how long after the store is back a waiting job may still wait
UPLOAD_THREADS = 4  # uploads at once once the store is back
ADOPT_INTERVAL = 30.0  # seconds between looks for what stopped workers left in the spool

# ends a spooled job: succeeded with its images stored (reason None), else failed for `reason`
EndSpooledJob = Callable[["WorkerRuntime", SpooledJob, str | None], str]


class SpoolUploader:
    def __init__(self, runtime: WorkerRuntime, end_spooled_job: EndSpooledJob) -> None:
        self.runtime = runtime
        self.spool = runtime.spool
        self.end_spooled_job = end_spooled_job
        self._adopted_from: dict[str, str] = {}  # job id -> the stopped worker whose spool held it, until taken over
        self._reasons: dict[str, str] = {}  # job id -> the storing reason its record shows
        self._pool = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="stepwise-spool-upload")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepwise-spool-uploader", daemon=True)

    def start(self) -> SpoolUploader:
        self.adopt_orphans()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def adopt_orphans(self) -> None:
        try:
            for stopped_worker_id, job in self.spool.adopt_orphans():
                self._adopted_from[job.job_id] = stopped_worker_id
                try:
                    self._take_over(job)
                except StorageError as e:  # Redis away: upload() tries again
                    log.warning("job %s: not yet taken over from a stopped worker's spool (%s)", job.job_id, e)
        except OSError as e:
            log.warning("spool: could not look for what stopped workers left in %s: %s", self.spool.root, e)

    def _run(self) -> None:
        num_failures = 0
        next_adoption = time.monotonic() + ADOPT_INTERVAL
        while not self._stopped.is_set():
            if time.monotonic() >= next_adoption:
                self.adopt_orphans()
                self.drop_ended()
                next_adoption = time.monotonic() + ADOPT_INTERVAL
            if not self.spool.wait_for_jobs(timeout=1.0):
                continue
            try:
                is_stored = self.upload_round()
            except Exception:  # the uploader must outlive any one bad job
                log.exception("spool: upload round failed")
                is_stored = False
            num_failures = 0 if is_stored else num_failures + 1
            if num_failures:
                wait = min(RETRY_MAX_WAIT, RETRY_FIRST_WAIT * 2 ** (num_failures - 1))
                self._stopped.wait(wait + random.uniform(0, RETRY_FIRST_WAIT))

    def drop_ended(self) -> list[str]:
        """Forget the waiting jobs that ended meanwhile (deleted by their tenant, past retention) or that another
        worker runs again, so they hold no room in the spool through a long outage; returns their ids."""
        dropped: list[str] = []
        for job in self.spool.waiting():
            if job.job_id in self._adopted_from:
                continue
            try:
                record = self.runtime.job_store.get(job.job_id)
            except StorageError:  # Redis away: the next look
                return dropped
            if record is None or record.state is not JobState.RUNNING or record.worker_id != self.runtime.worker_id:
                log.info("job %s: dropped from the spool: it ended or runs elsewhere", job.job_id)
                self._forget(job.job_id)
                dropped.append(job.job_id)
        return dropped

    def upload_round(self) -> bool:
        """The oldest job first; once it is stored, the rest UPLOAD_THREADS at a time (the backlog of a long outage
        is stored within seconds of the store answering). False if any failed."""
        waiting = self.spool.waiting()
        if not waiting:
            return True
        first, *rest = waiting
        if not self.upload(first):
            return False
        results = list(self._pool.map(self.upload, rest))  # every one done before the next round
        return all(results)

    def upload(self, job: SpooledJob) -> bool:
        """Store one job's images and end it (or drop it). False if the store or Redis failed: try again later."""
        job_id = job.job_id
        try:
            if job_id in self._adopted_from and not self._take_over(job):
                return True
            record = self.runtime.job_store.get(job_id)
            if record is None or record.state is not JobState.RUNNING or record.worker_id != self.runtime.worker_id:
                state = record.state.value if record is not None else "gone"
                log.warning("job %s: spooled images dropped: the job is %s (or runs elsewhere)", job_id, state)
                self._forget(job_id)
                return True
            if time.time() - job.spooled_at > self.runtime.settings.storage.job_ttl_seconds:
                why = f"image storage stayed unavailable for longer than the job's retention: {self.spool.last_error}"
                self.end_spooled_job(self.runtime, job, why)
                self._forget(job_id)
                return True
            images = self.spool.images_of(job)
        except StorageError as e:  # Redis away
            log.warning("job %s: spooled, its record cannot be read now (%s)", job_id, e)
            return False
        except OSError as e:  # the spool's disk lost them: the lease lapses and the job runs again
            log.error("job %s: its spooled images cannot be read (%s); left to run again", job_id, e)
            self._forget(job_id)
            return True
        try:
            put_images(self.runtime.image_store, images)
        except StorageError as e:
            self._note_storing(job_id, str(e))
            return False
        try:
            self.end_spooled_job(self.runtime, job, None)
        except StorageError as e:  # Redis away after the upload: the images are there, the next round ends it
            log.warning("job %s: stored from the spool, not yet ended (%s)", job_id, e)
            return False
        metrics.JOBS.labels("stored_from_spool").inc()
        self._forget(job_id)
        return True

    def _take_over(self, job: SpooledJob) -> bool:
        """Hold, under this worker, the job a stopped worker spooled; False (and dropped) if it ended or runs
        elsewhere. A Redis error leaves it to try later."""
        runtime = self.runtime
        record = runtime.job_store.adopt(
            job.job_id, self._adopted_from[job.job_id], runtime.worker_id, runtime.lease_seconds
        )
        del self._adopted_from[job.job_id]
        if record is None:
            log.info("job %s: left in a stopped worker's spool, but it ended or runs again elsewhere", job.job_id)
            self.spool.remove(job.job_id)
            return False
        runtime.leases.hold(job.job_id)
        log.info("job %s: taken over from a stopped worker's spool", job.job_id)
        return True

    def _note_storing(self, job_id: str, why: str) -> None:
        self.spool.note_error(why)
        if self._reasons.get(job_id) == why:
            return
        try:
            self.runtime.job_store.set_storing(job_id, self.runtime.worker_id, why)
            self._reasons[job_id] = why
        except StorageError as e:
            log.warning("job %s: storing reason not written (%s)", job_id, e)

    def _forget(self, job_id: str) -> None:
        """Done with the job here: its spooled images go, and its lease is no longer renewed (if it did not end,
        it lapses and the job runs again)."""
        self.spool.remove(job_id)
        self._reasons.pop(job_id, None)
        self.runtime.leases.release(job_id)
