"""One simulated worker of `benchmarks.fleet`: the worker's own Redis pieces around a timed stand-in for the engine.

Real, unchanged: the feeder (`worker.feeder.Feeder`: `JobStore.take_next`, the model's wake-up list), the book of
held jobs (`worker.held_jobs.HeldJobs`), the lease keeper (`worker.leases.LeaseKeeper`), the lapsed lease sweeper
and its dead-worker watch (`worker.leases.LapsedLeaseSweeper`, `worker.dead_workers.DeadWorkerWatch`), a heartbeat
as `worker.heartbeat` builds it every STEPWISE_HEARTBEAT_INTERVAL (`JobStore.beat`), and the end script
(`JobStore.finish`).

A stand-in: the engine and the job's thread. A job "runs" for its drawn number of seconds, and its thread does the
Redis I/O `worker.job_watch` does meanwhile: every STEPWISE_WORKER_POLL_INTERVAL a cancel check, and progress at
most every STEPWISE_PROGRESS_INTERVAL; then it ends `succeeded` with one image key (nothing encoded or stored).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from storage.heartbeats import Heartbeat, engine_snapshot
from storage.job_record import JobRecord, JobState
from storage.job_store import JobStore
from worker.dead_workers import DeadWorkerWatch
from worker.feeder import Feeder
from worker.heartbeat import family_defaults, family_limits
from worker.held_job import HeldJob
from worker.held_jobs import HeldJobs
from worker.leases import LapsedLeaseSweeper, LeaseKeeper

MODEL, FAMILY = "builtin:tiny", "sd"
# An engine's statistics as a busy worker's heartbeat carries them (the size of what every watch reads).
ENGINE_STATS = {
    "num_running": 4,
    "num_waiting": 0,
    "jobs_per_forward": {"1": 40, "2": 120, "3": 310, "4": 2200},
    "steps_per_second": 11.8,
    "images_per_second": 0.59,
    "running_by_key": {"builtin:tiny 512x512": 4},
    "waiting_by_key": {},
    "threads_failed": {},
}


def worker_heartbeat(worker_id: str, queue: str, capacity: int, seen_at: float, *, is_admitting: bool = True):
    """A heartbeat as `worker.heartbeat.current_heartbeat` builds it for a busy builtin:tiny worker."""
    return Heartbeat(
        worker_id=worker_id,
        model=MODEL,
        queue=queue,
        family=FAMILY,
        capacity=capacity,
        seen_at=seen_at,
        is_admitting=is_admitting,
        defaults=family_defaults(FAMILY),
        limits={**family_limits(FAMILY), "needs_init_image": False},
        engine=engine_snapshot(ENGINE_STATS),
        spool={"num_jobs": 0, "num_bytes": 0, "max_bytes": 1 << 30, "is_full": False, "storage_error": None},
    )


def departed_heartbeat(worker_id: str, queue: str, seen_at: float) -> Heartbeat:
    """The last heartbeat of a worker that stopped cleanly (it said it admits nothing more)."""
    return worker_heartbeat(worker_id, queue, 4, seen_at, is_admitting=False)


@dataclass(frozen=True)
class FleetTiming:
    """The worker's timers, as the settings table's defaults give them."""

    capacity: int = 4  # STEPWISE_MAX_NUM_SEQS: jobs one worker runs at once
    job_seconds: float = 6.0  # the stand-in's mean run time; each job draws within +-25%
    steps: int = 30
    lease_seconds: int = 60  # STEPWISE_JOB_LEASE_SECONDS
    sweep_interval: float = 15.0  # STEPWISE_LEASE_SWEEP_INTERVAL: the lease / 4
    heartbeat_interval: float = 3.0  # STEPWISE_HEARTBEAT_INTERVAL
    worker_timeout: float = 10.0  # STEPWISE_WORKER_TIMEOUT
    poll_interval: float = 0.2  # STEPWISE_WORKER_POLL_INTERVAL
    progress_interval: float = 0.5  # STEPWISE_PROGRESS_INTERVAL


@dataclass
class WorkerLog:
    """What one simulated worker saw, in wall-clock seconds (compared with the fleet's measuring window)."""

    takes: list[tuple[float, float, str]] = field(default_factory=list)  # (answered at, seconds, tenant)
    ends: list[float] = field(default_factory=list)  # when each job's end was written
    calls: dict[str, list[float]] = field(default_factory=dict)  # JobStore method -> when each call was made


class MeteredJobStore(JobStore):
    """The job store, noting when each of the calls a worker makes was made (and how long a take took)."""

    log: WorkerLog

    def _note(self, name: str) -> None:
        self.log.calls.setdefault(name, []).append(time.time())

    def take_next(self, queue: str, worker_id: str, lease_seconds: int) -> JobRecord | None:
        started = time.perf_counter()
        record = super().take_next(queue, worker_id, lease_seconds)
        self._note("take_next")
        if record is not None:
            self.log.takes.append((time.time(), time.perf_counter() - started, record.tenant))
        return record

    def wait_for_work(self, queue: str, timeout: float) -> bool:
        self._note("wait_for_work")
        return super().wait_for_work(queue, timeout)

    def renew_lease(self, job_id: str, holder: str, lease_seconds: int) -> bool:
        self._note("renew_lease")
        return super().renew_lease(job_id, holder, lease_seconds)

    def set_progress(self, job_id: str, step: int, total: int, **flags: Any) -> None:
        self._note("set_progress")
        super().set_progress(job_id, step, total, **flags)

    def is_cancel_requested(self, job_id: str) -> bool:
        self._note("is_cancel_requested")
        return super().is_cancel_requested(job_id)

    def finish(self, job_id: str, state: JobState, *, holder: str | None = None, **fields: Any) -> bool:
        self._note("finish")
        return super().finish(job_id, state, holder=holder, **fields)

    def beat(self, heartbeat: Heartbeat) -> None:
        self._note("beat")
        super().beat(heartbeat)

    def lapsed_job_ids(self, now: float | None = None) -> list[str]:
        self._note("lapsed_job_ids")
        return super().lapsed_job_ids(now)


class SimulatedWorker:
    def __init__(self, redis_url: str, worker_id: str, queue: str, timing: FleetTiming) -> None:
        self.worker_id = worker_id
        self.timing = timing
        self.log = WorkerLog()
        self.store = MeteredJobStore(redis_url, worker_timeout=timing.worker_timeout)
        self.store.log = self.log
        self.stopping = threading.Event()
        # What worker.feeder.Feeder reads of the worker's runtime.
        self.job_store = self.store
        self.settings = SimpleNamespace(queue=queue)
        self.lease_seconds = timing.lease_seconds
        self.room_changed = threading.Event()
        self.held = HeldJobs(on_change=self.room_changed.set)  # the worker's book of held jobs, as the runtime's
        self.leases = LeaseKeeper(self.store, self.held, timing.lease_seconds, on_lost=lambda job_id, holder: None)
        watch = DeadWorkerWatch(self.store, timeout=timing.worker_timeout, own_worker_id=worker_id)
        self.sweeper = LapsedLeaseSweeper(self.store, timing.sweep_interval, watch, self.held.holds)
        # This object stands in for the runtime: the part of it the feeder reads (may_take_jobs, room_changed, ...).
        self.feeder = Feeder(self, run_stand_in)  # type: ignore[arg-type]
        self._beats = threading.Thread(target=self._beat, name=f"beat-{worker_id}", daemon=True)

    def may_take_jobs(self) -> bool:
        return not self.stopping.is_set() and self.held.num_running < self.timing.capacity

    def heartbeat(self) -> Heartbeat:
        return worker_heartbeat(self.worker_id, self.settings.queue, self.timing.capacity, time.time())

    def _beat(self) -> None:
        while not self.stopping.wait(self.timing.heartbeat_interval):
            self.store.beat(self.heartbeat())

    def start(self) -> SimulatedWorker:
        self.store.beat(self.heartbeat())
        self._beats.start()
        self.sweeper.start()
        self.feeder.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.room_changed.set()
        self.feeder.stop(timeout=2 * self.timing.job_seconds)
        self.sweeper.stop()
        self.leases.stop()
        self._beats.join(timeout=5)
        self.store.close()


def run_stand_in(worker: SimulatedWorker, held: HeldJob, record: JobRecord) -> None:
    """The engine's stand-in, with the job thread's Redis I/O (see the module docstring)."""
    timing, store = worker.timing, worker.store
    seconds = random.Random(record.job_id).uniform(0.75, 1.25) * timing.job_seconds
    started = last_progress = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        time.sleep(timing.poll_interval)
        if store.is_cancel_requested(record.job_id):
            break
        if time.monotonic() - last_progress >= timing.progress_interval:
            store.set_progress(record.job_id, min(timing.steps, int(timing.steps * elapsed / seconds)), timing.steps)
            last_progress = time.monotonic()
    store.finish(record.job_id, JobState.SUCCEEDED, holder=held.holder, image_keys=[f"{record.job_id}/0.png"])
    worker.log.ends.append(time.time())
    worker.held.let_go(held)  # after the end is written, as worker.job_ends does
