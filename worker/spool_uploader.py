"""The thread that empties the spool (worker.spool): uploads its jobs' images once the store answers, and
ends each job.

It tries the oldest job first, then the others several at a time; while the store fails it tries
again after a backoff (RETRY_FIRST_WAIT, doubling up to RETRY_MAX_WAIT, so a job is stored within about
that long of the store answering again) and updates the job's `storing` reason when it changes. There
is no cap on how long it keeps trying but the job's own retention (`STEPWISE_JOB_TTL`): a job spooled
longer than that fails `storage_unavailable`.

Before uploading it reads the job's record: a job that ended (deleted, canceled meanwhile by its
retention) or that its attempt here no longer holds (re-queued, and it runs again elsewhere) is dropped
here, not stored, so a job never ends twice. Jobs a stopped worker left in a shared spool are taken over
(`JobStore.adopt`: only from the attempt that spooled them) and held here (`worker.held_jobs`), at start
and every ADOPT_INTERVAL; as often, waiting jobs that ended meanwhile are dropped (`drop_ended`), so a
deleted job holds no room through a long outage. Nothing here waits for the model: the uploader starts
before it loads, and the image store and spool are opened without the engine's lock.
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
from storage.job_record import JobRecord, JobState
from worker import metrics
from worker.held_job import HeldJob, StopReason
from worker.output_images import put_images
from worker.spool import Orphan, SpooledJob

if TYPE_CHECKING:
    from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)

RETRY_FIRST_WAIT = 0.5  # seconds
RETRY_MAX_WAIT = 10.0  # seconds: how long after the store is back a waiting job may still wait
UPLOAD_THREADS = 4  # uploads at once once the store is back
ADOPT_INTERVAL = 30.0  # seconds between looks for what stopped workers left in the spool

# ends a spooled job and lets it go: succeeded with its images stored (reason None), else failed for `reason`
EndSpooledJob = Callable[["WorkerRuntime", HeldJob, str | None], str]


class SpoolUploader:
    def __init__(self, runtime: WorkerRuntime, end_spooled_job: EndSpooledJob) -> None:
        self.runtime = runtime
        self.spool = runtime.spool
        self.end_spooled_job = end_spooled_job
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

    def adopt_orphans(self) -> list[str]:
        """Take over, and hold here, each job a stopped worker left in the spool (`ImageSpool.orphans` checked its
        folder) whose images are stored under its own keys and whose record says the attempt that spooled it still
        holds it; drop the others. A Redis error leaves the rest where they are, for the next look. Returns the ids
        taken over; each adoption is logged."""
        adopted: list[str] = []
        try:
            for orphan in self.spool.orphans():
                try:
                    if self._adopt(orphan):
                        adopted.append(orphan.job.job_id)
                except StorageError as e:
                    log.warning("spool: not taking over what stopped workers left yet (%s); trying again later", e)
                    break
        except OSError as e:
            log.warning("spool: could not look for what stopped workers left in %s: %s", self.spool.root, e)
        return adopted

    def _adopt(self, orphan: Orphan) -> bool:
        runtime, job = self.runtime, orphan.job
        if job.image_keys != self._own_keys(job):
            log.warning("spool: removing %s: its images are not stored under its job's keys", orphan.folder)
            self.spool.discard(orphan)
            return False
        record = runtime.job_store.adopt(job.job_id, job.holder, runtime.worker_id, runtime.lease_seconds)
        if record is None:
            log.warning(
                "spool: removing %s: job %s is not held by %s, the attempt of stopped worker %s that spooled it "
                "(it ended, or went back to the queue)",
                orphan.folder,
                job.job_id,
                job.holder,
                orphan.stopped_worker_id,
            )
            self.spool.discard(orphan)
            return False
        try:
            self.spool.move_here(orphan)
        except OSError as e:  # taken over but not moved: not held here, so its lease lapses and it runs again
            log.error("job %s: taken over from %s's spool but not moved here (%s)", job.job_id, orphan.folder, e)
            return False
        runtime.held.take(record, spooled=job)
        log.info(
            "job %s: adopted from stopped worker %s's spool (%d images, %d bytes): its images are stored from here",
            job.job_id,
            orphan.stopped_worker_id,
            len(job.image_keys),
            job.num_bytes,
        )
        return True

    def _own_keys(self, job: SpooledJob) -> list[str] | None:
        """The keys the image store gives this job's images, in their formats (None: a format it does not store):
        a stopped worker's job.json may name no other, or its images would replace another job's."""
        try:
            return [
                self.runtime.image_store.key_for(job.job_id, index, key.rsplit(".", 1)[-1])
                for index, key in enumerate(job.image_keys)
            ]
        except ValueError:
            return None

    def _run(self) -> None:
        num_failures = 0
        next_adoption = time.monotonic() + ADOPT_INTERVAL
        while not self._stopped.is_set():
            if time.monotonic() >= next_adoption:
                self.adopt_orphans()
                self.drop_ended()
                next_adoption = time.monotonic() + ADOPT_INTERVAL
            if not self.runtime.held.wait_for_spooled(timeout=1.0):
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
        """Forget the waiting jobs that ended meanwhile (deleted by their tenant, past retention) or that their
        attempt here no longer holds, so they hold no room in the spool through a long outage; returns their ids."""
        dropped: list[str] = []
        for held in self.runtime.held.spooled():
            try:
                record = self.runtime.job_store.get(held.job_id)
            except StorageError:  # Redis away: the next look
                return dropped
            if not self._still_holds(held, record):
                log.info("job %s: dropped from the spool: it ended or runs elsewhere", held.job_id)
                self._forget(held)
                dropped.append(held.job_id)
        return dropped

    def upload_round(self) -> bool:
        """The oldest job first; once it is stored, the rest UPLOAD_THREADS at a time (the backlog of a long outage
        is stored within seconds of the store answering). False if any failed."""
        waiting = self.runtime.held.spooled()
        if not waiting:
            return True
        first, *rest = waiting
        if not self.upload(first):
            return False
        results = list(self._pool.map(self.upload, rest))  # every one done before the next round
        return all(results)

    def upload(self, held: HeldJob) -> bool:
        """Store one job's images and end it (or drop it). False if the store or Redis failed: try again later."""
        job_id = held.job_id
        job = held.spooled
        assert job is not None
        try:
            record = self.runtime.job_store.get(job_id)
            if not self._still_holds(held, record):
                state = record.state.value if record is not None else "gone"
                log.warning("job %s: spooled images dropped: the job is %s (or runs elsewhere)", job_id, state)
                self._forget(held)
                return True
            if time.time() - job.spooled_at > self.runtime.settings.storage.job_ttl_seconds:
                why = f"image storage stayed unavailable for longer than the job's retention: {self.spool.last_error}"
                self.end_spooled_job(self.runtime, held, why)
                self._reasons.pop(job_id, None)
                return True
            images = self.spool.images_of(job)
        except StorageError as e:  # Redis away
            log.warning("job %s: spooled, its record cannot be read now (%s)", job_id, e)
            return False
        except OSError as e:  # the spool's disk lost them: the lease lapses and the job runs again
            log.error("job %s: its spooled images cannot be read (%s); left to run again", job_id, e)
            self._forget(held)
            return True
        try:
            put_images(self.runtime.image_store, images)
        except StorageError as e:
            self._note_storing(held, str(e))
            return False
        try:
            self.end_spooled_job(self.runtime, held, None)
        except StorageError as e:  # Redis away after the upload: the images are there, the next round ends it
            log.warning("job %s: stored from the spool, not yet ended (%s)", job_id, e)
            return False
        metrics.JOBS.labels("stored_from_spool").inc()
        self._reasons.pop(job_id, None)
        return True

    def _still_holds(self, held: HeldJob, record: JobRecord | None) -> bool:
        """Whether the job still runs under this attempt (not lost, ended, deleted or taken elsewhere)."""
        if held.stop_reason is StopReason.LEASE_LOST or record is None or record.state is not JobState.RUNNING:
            return False
        return record.holder == held.holder

    def _note_storing(self, held: HeldJob, why: str) -> None:
        self.spool.note_error(why)
        if self._reasons.get(held.job_id) == why:
            return
        try:
            self.runtime.job_store.set_storing(held.job_id, held.holder, why)
            self._reasons[held.job_id] = why
        except StorageError as e:
            log.warning("job %s: storing reason not written (%s)", held.job_id, e)

    def _forget(self, held: HeldJob) -> None:
        """Done with the job here: its spooled images go, and it is let go (if it did not end, its lease lapses and
        it runs again)."""
        self.spool.remove(held.job_id)
        self._reasons.pop(held.job_id, None)
        self.runtime.held.let_go(held)
