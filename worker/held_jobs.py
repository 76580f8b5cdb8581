"""The held-jobs book: every job this worker holds, from the take to the let-go, behind one lock.

A job is held from the moment this worker's take of it is written in Redis (`JobStore.take_next` by the feeder,
or `JobStore.adopt` of a stopped worker's spooled job) until its end, its re-queue or its loss is settled: `take`
is the one place a job becomes held and `let_go` the one place it stops being held, called only after its end or
re-queue is written. Its lease is renewed for exactly that long (`worker.leases.LeaseKeeper` renews what the book
holds), so this worker's own lease sweeper never re-queues a job while its end is being written.

Each attempt carries its holder token (`worker_id#attempt`, `storage.job_record.holder_token`), and Redis accepts a
holder's writes only from the attempt that holds the job now. So when another process re-queues a job behind this
worker's back (a freeze past the dead-worker timeout, a lease that lapsed) and this worker's feeder takes it again:

- the new attempt *joins* the one still running here if that one has not begun to end and nothing stops it: the
  book moves it on to the new attempt and token, no second thread or engine run starts, and the job ends once, with
  the images of the run already under way;
- otherwise (the earlier attempt was told it lost the job, or is writing its way out with a token that is no longer
  good) the new attempt waits, in `Stage.TAKEN`, for the earlier one to be let go (`HeldJob.predecessor`), then runs.

Either way the job never runs twice in this engine, and no stale attempt can end, fail or re-queue it.

Who reads and writes it: the feeder takes (and counts what runs), the job's thread moves it through its stages and
lets it go, the lease keeper renews and reports losses, the drain and `celery control` stop jobs, the spool's
uploader holds spooled jobs (`Stage.SPOOLED`) until their images are stored.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from storage.job_record import JobRecord
from worker.held_job import ENGINE_STAGES, RUNNING_STAGES, HeldJob, Stage, StopReason

if TYPE_CHECKING:
    from batching.job import JobFuture
    from worker.spool import SpooledJob

log = logging.getLogger(__name__)


class HeldJobs:
    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._changed = threading.Condition()  # the one lock; notified whenever a job changes stage or goes
        self._jobs: dict[str, HeldJob] = {}  # job_id -> its attempt held here now
        self.on_change = on_change  # called (outside the lock) when room may have opened: the feeder looks again

    # -- the one take, the one let-go ---------------------------------------------------------

    def take(self, record: JobRecord, *, spooled: SpooledJob | None = None) -> HeldJob | None:
        """Hold the attempt `record` says this worker took (its holder token is `record.holder`); with `spooled`, a
        job whose images wait in the spool. Returns the new attempt for a thread of its own to run, or None when it
        joined the earlier attempt still running here (see the module docstring)."""
        assert record.holder is not None, "a taken job has a holder"
        with self._changed:
            earlier = self._jobs.get(record.job_id)
            if earlier is not None and earlier.stop_reason is None and earlier.stage is not Stage.ENDING:
                log.warning(
                    "job %s: taken again (attempt %d) while attempt %d still runs here: it carries on as attempt %d",
                    record.job_id,
                    record.attempts,
                    earlier.attempt,
                    record.attempts,
                )
                earlier.attempt, earlier.holder = record.attempts, record.holder
                return None
            held = HeldJob(record.job_id, record.attempts, record.holder, record.tenant, predecessor=earlier)
            if spooled is not None:
                held.stage, held.spooled = Stage.SPOOLED, spooled
            if earlier is not None:
                log.warning(
                    "job %s: taken again (attempt %d) while attempt %d winds down here: it runs once that one is gone",
                    record.job_id,
                    record.attempts,
                    earlier.attempt,
                )
            self._jobs[record.job_id] = held
            self._changed.notify_all()
        return held

    def let_go(self, held: HeldJob) -> None:
        """Stop holding this attempt: its end or re-queue is written (or it was lost, or left to its lease). Its
        lease is no longer renewed from now on."""
        with self._changed:
            if self._jobs.get(held.job_id) is held:
                del self._jobs[held.job_id]
            held.is_let_go.set()
            self._changed.notify_all()
        self.on_change()

    # -- stages -------------------------------------------------------------------------------

    def wait_for_predecessor(self, held: HeldJob) -> None:
        """Before the engine: an earlier attempt here that is stopping must be gone first (the engine refuses a job
        id it still runs)."""
        if held.predecessor is not None and not held.predecessor.is_let_go.is_set():
            earlier = held.predecessor
            log.info("job %s: attempt %d waits for attempt %d to stop", held.job_id, held.attempt, earlier.attempt)
            earlier.is_let_go.wait()
        held.predecessor = None

    def enter_engine(self, held: HeldJob) -> bool:
        """Taken -> in the engine, unless a stop came first (False: its `stop_reason` says why)."""
        with self._changed:
            if held.stop_reason is not None:
                return False
            held.stage = Stage.IN_ENGINE
            held.submitted_at, held.handed_over_at = time.monotonic(), time.time()
            return True

    def set_future(self, held: HeldJob, future: JobFuture) -> bool:
        """The engine has the job; True if a stop came while it took it (the caller cancels it in the engine)."""
        with self._changed:
            held.future = future
            return held.stop_reason is not None

    def leave_engine(self, held: HeldJob) -> None:
        """The engine is done with it (a result, a failure or a stop): its outputs are stored next, if any."""
        with self._changed:
            held.stage = Stage.STORING
            self._changed.notify_all()
        self.on_change()

    def begin_ending(self, held: HeldJob) -> None:
        """Its way out is about to be written with its holder token: no take from now on joins this attempt."""
        with self._changed:
            held.stage = Stage.ENDING
            self._changed.notify_all()

    def spool(self, held: HeldJob, spooled: SpooledJob) -> None:
        """Its images wait in the spool: the spool's uploader holds it now (its thread ends)."""
        with self._changed:
            held.stage, held.spooled, held.thread = Stage.SPOOLED, spooled, None
            self._changed.notify_all()
        self.on_change()

    def stop(self, held: HeldJob, reason: StopReason) -> JobFuture | None:
        """Ask the job to stop for `reason` (the first reason stands, but a lost lease wins over a cancel: this
        worker must not end a job it lost). Returns its engine future to cancel, if it has one yet."""
        with self._changed:
            if held.stop_reason is None or reason is StopReason.LEASE_LOST:
                held.stop_reason = reason
            return held.future

    def lose(self, job_id: str, holder: str) -> HeldJob | None:
        """Redis refused `holder`'s lease renewal: if that attempt is still the one held here, mark it lost and
        return it (to stop it in the engine). None if the job was taken again here meanwhile (its new attempt holds
        it) or let go."""
        with self._changed:
            held = self._jobs.get(job_id)
            if held is None or held.holder != holder:
                return None
            held.stop_reason = StopReason.LEASE_LOST
            self._changed.notify_all()
            return held

    # -- reads --------------------------------------------------------------------------------

    def get(self, job_id: str) -> HeldJob | None:
        with self._changed:
            return self._jobs.get(job_id)

    def holds(self, job_id: str) -> bool:
        with self._changed:
            return job_id in self._jobs

    def holders(self) -> list[tuple[str, str]]:
        """(job id, holder token) of every job held: the leases to renew."""
        with self._changed:
            return sorted((held.job_id, held.holder) for held in self._jobs.values())

    def all(self) -> list[HeldJob]:
        with self._changed:
            return list(self._jobs.values())

    def running(self) -> list[HeldJob]:
        """The jobs a thread of their own runs (every stage but spooled)."""
        with self._changed:
            return [held for held in self._jobs.values() if held.stage in RUNNING_STAGES]

    def before_or_in_engine(self) -> list[HeldJob]:
        """The jobs not yet through the engine: what a drain or shutdown may still hand back."""
        with self._changed:
            return [held for held in self._jobs.values() if held.stage in ENGINE_STAGES]

    def spooled(self) -> list[HeldJob]:
        """The jobs whose images wait in the spool, oldest first."""
        with self._changed:
            waiting = [held for held in self._jobs.values() if held.stage is Stage.SPOOLED]
        return sorted(waiting, key=lambda held: held.spooled.spooled_at if held.spooled else 0.0)

    @property
    def num_running(self) -> int:
        return len(self.running())

    def spooled_bytes(self) -> int:
        return sum(held.spooled.num_bytes for held in self.spooled() if held.spooled is not None)

    def threads(self) -> list[threading.Thread]:
        """The threads of the jobs held, and of earlier attempts they wait for."""
        with self._changed:
            attempts = [*self._jobs.values(), *(h.predecessor for h in self._jobs.values() if h.predecessor)]
            return [held.thread for held in attempts if held.thread is not None]

    def wait_until_idle(self, timeout: float) -> bool:
        """Whether no job is before or in the engine, waiting up to `timeout` seconds for it."""
        with self._changed:
            return self._changed.wait_for(
                lambda: not any(held.stage in ENGINE_STAGES for held in self._jobs.values()), timeout
            )

    def wait_for_spooled(self, timeout: float) -> bool:
        """Whether a job waits in the spool, waiting up to `timeout` seconds for one."""
        with self._changed:
            return self._changed.wait_for(
                lambda: any(held.stage is Stage.SPOOLED for held in self._jobs.values()), timeout
            )
