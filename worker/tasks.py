"""One job, from taken to an end state, on a thread of its own (`worker.feeder` takes it, holds it in the worker's
book, `worker.held_jobs`, and starts it).

`run_taken_job` is the job's straight line, each step once (`worker.job_steps`):

1. a job whose deadline passed before it started ends `expired`;
2. its parameters are read (input images, its LoRA adapter's store key);
3. it is submitted to this process's engine, and its thread waits, writing progress and watching for a cancel
   request (`worker.job_watch`);
4. its outputs are encoded and stored here, on the job's thread: the job `succeeded`.

A step that finds the job cannot go on raises its way out (`worker.ways_out`): the job ends (expired, invalid,
canceled, failed in the engine or in encoding), goes back to the queue (a drain, warm shutdown or stopping
engine), is let go (its lease lost to another worker), waits in the spool (the image store failed: it stays
running with its images in this worker's spool until they are stored, `worker.spool`), or is left to its lease
(Redis stayed away). `run_held_job` acts on each, in one place (`worker.job_ends`), then lets the job go.
"""

from __future__ import annotations

import logging

from storage.errors import StorageError
from storage.job_record import JobRecord
from worker import metrics
from worker.held_job import HeldJob, Stage
from worker.job_ends import end_job, keep_in_spool, patiently, requeue
from worker.job_steps import check_deadline, params_to_run, start_in_engine, store_outputs, wait_in_engine
from worker.runtime import WorkerRuntime
from worker.ways_out import BackToQueue, Ends, LeaseLost, LeftToLease, WaitsInSpool, WayOut
from worker.webhooks import emit_event

log = logging.getLogger(__name__)


def run_job(runtime: WorkerRuntime) -> str:
    """Take this worker's queue's next job and run it on this thread (what the feeder does, one job at a time:
    for tests and tools)."""
    taken = patiently(
        runtime, runtime.job_store.take_next, runtime.settings.queue, runtime.worker_id, runtime.lease_seconds
    )
    if taken is None:
        return "nothing queued"
    held = runtime.held.take(taken)
    if held is None:
        return "joined the attempt running here"
    return run_held_job(runtime, held, taken)


def run_taken_job(runtime: WorkerRuntime, held: HeldJob, record: JobRecord) -> Ends:
    """The job's straight line: how it ends if nothing stops it (each way out is raised, `worker.ways_out`)."""
    check_deadline(record)
    emit_event(record, "started")
    params = params_to_run(runtime, record)
    start_in_engine(runtime, held, record, params)
    result = wait_in_engine(runtime, held, record)
    return store_outputs(runtime, held, record, result)


def run_held_job(runtime: WorkerRuntime, held: HeldJob, taken: JobRecord) -> str:
    """Run a job this worker holds (`held`, the attempt `taken` says it took) to an end state, back to the queue or
    into the spool, act on how it left, once, and let it go (a spooled job stays held: the spool's uploader ends
    it). Returns what became of it (`succeeded`, `requeued`, `lease lost`, ...)."""
    way_out: WayOut
    try:
        way_out = run_taken_job(runtime, held, taken)
    except WayOut as raised:
        way_out = raised
    except StorageError as e:
        way_out = LeftToLease(str(e))
    except Exception as e:  # a bug must end the job readably, not leave it running
        log.exception("job %s: worker error", taken.job_id)
        way_out = Ends.failed("worker_error", f"{type(e).__name__}: {e}")
    try:
        runtime.held.begin_ending(held)
        return take_way_out(runtime, held, taken, way_out)
    except StorageError as e:
        return take_way_out(runtime, held, taken, LeftToLease(str(e)))
    finally:
        if held.stage is not Stage.SPOOLED:  # its way out is written: no longer held here
            runtime.held.let_go(held)


def take_way_out(runtime: WorkerRuntime, held: HeldJob, record: JobRecord, way_out: WayOut) -> str:
    match way_out:
        case Ends(state=state, fields=fields):
            return end_job(runtime, held, record, state, **fields)
        case BackToQueue(why=why):
            return requeue(runtime, held, record, why)
        case WaitsInSpool(spooled=spooled, images=images, why=why):
            return keep_in_spool(runtime, held, record, spooled, images, why)
        case LeaseLost():
            metrics.JOBS.labels("lease_lost").inc()
            return "lease lost"
        case LeftToLease(why=why):
            log.warning("job %s: left to its lease (%s)", record.job_id, why)
            return "left to its lease"
    raise TypeError(f"not a way out: {way_out!r}")
