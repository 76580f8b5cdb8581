"""What a worker writes when a job it holds leaves it: an end state, back to the queue, or into the spool.

`worker.tasks.run_held_job` calls these for a taken job's way out (`worker.ways_out`), and the spool's uploader
calls `end_spooled_job` once a spooled job's images are stored. Each writes with the attempt's holder token, so
only while this attempt still holds the job (the Redis scripts check): a job ends once. The job is let go (its
lease no longer renewed) only after its way out is written (`worker.held_jobs`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from storage.errors import StorageError
from storage.job_record import JobRecord, JobState
from storage.webhooks import EVENT_FOR_STATE
from worker import metrics
from worker.held_job import HeldJob
from worker.outage_retry import retry_through_outage
from worker.output_images import OutputImage
from worker.runtime import WorkerRuntime
from worker.spool import SpooledJob
from worker.webhooks import emit_event

log = logging.getLogger(__name__)
T = TypeVar("T")


def patiently(runtime: WorkerRuntime, call: Callable[..., T], *args, **kwargs) -> T:
    """Record I/O that rides out a short Redis outage (`worker.outage_retry`)."""
    return retry_through_outage(runtime.settings.redis_retry_seconds, call, *args, **kwargs)


def end_job(runtime: WorkerRuntime, held: HeldJob, record: JobRecord, state: JobState, **fields) -> str:
    """Record the job's end state (only if this attempt still holds it) and announce it. A job that succeeded has
    its images flushed to disk afterwards (the local image folder; off the job's latency: storage.image_store)."""
    if not patiently(runtime, runtime.job_store.finish, record.job_id, state, holder=held.holder, **fields):
        if patiently(runtime, runtime.job_store.was_deleted, record.job_id):
            runtime.image_store.delete_job_images(record.job_id)  # what it stored before it learned it
            log.info("job %s: deleted by its tenant while it ran; its images removed", record.job_id)
            return "deleted"
        log.warning("job %s: not marked %s: attempt %d no longer holds it", record.job_id, state.value, held.attempt)
        metrics.JOBS.labels("lease_lost").inc()
        return "lease lost"
    metrics.JOBS.labels(state.value).inc()
    metrics.JOB_SECONDS.observe(max(0.0, time.time() - record.created_at))
    if state is not JobState.SUCCEEDED:
        log.info("job %s: %s (%s)", record.job_id, state.value, fields.get("error_message", ""))
    event = EVENT_FOR_STATE.get(state.value) if state.is_terminal else None
    if event is not None:
        shown = {name: fields[name] for name in ("image_keys", "error_code", "error_message") if name in fields}
        emit_event(dataclasses.replace(record, state=state, **shown), event)
    if state is JobState.SUCCEEDED:
        _flush_images(runtime, record.job_id, fields["image_keys"])
    return state.value


def _flush_images(runtime: WorkerRuntime, job_id: str, image_keys: list[str]) -> None:
    try:
        runtime.image_store.flush(image_keys)
    except StorageError as e:
        log.warning("job %s: %s", job_id, e)


def requeue(runtime: WorkerRuntime, held: HeldJob, record: JobRecord, why: str) -> str:
    """Put a job this worker holds back in its queue, at its priority, for any worker."""
    store = runtime.job_store
    job_id = record.job_id
    reason = "worker_shutdown" if runtime.is_shutting_down else "worker_drained"
    message = f"{runtime.worker_id}: {why}"
    if not patiently(runtime, store.release, job_id, held.holder, reason, message):
        now = patiently(runtime, store.get, job_id)
        if now is not None and now.state is JobState.CANCELED:  # a cancel request won over the re-queue
            metrics.JOBS.labels("canceled").inc()
            emit_event(now, "canceled")
            return "canceled"
        log.info("job %s: not re-queued (%s): another worker holds it", job_id, why)
        return "not requeued"
    log.info("job %s: re-queued (%s)", job_id, why)
    metrics.JOBS.labels("requeued").inc()
    return "requeued"


def keep_in_spool(
    runtime: WorkerRuntime, held: HeldJob, record: JobRecord, spooled: SpooledJob, images: list[OutputImage], why: str
) -> str:
    """The image store failed: the job stays running, its images in this worker's spool (worker.spool) until the
    spool's uploader stores them and ends it (`end_spooled_job`). It stays held meanwhile (its lease renewed).

    The images are in the spool before the record says the job is storing: a worker killed between the two
    leaves a spooled job that the next worker on this spool adopts (its attempt still holds it), never a record
    that says its images wait in a spool that lacks them."""
    job_id = record.job_id
    runtime.spool.add(spooled, images)
    is_held = False
    try:
        is_held = patiently(runtime, runtime.job_store.set_storing, job_id, held.holder, why)
    finally:
        if not is_held:  # lost, or left to its lease by a Redis error: it runs again, so its images leave
            runtime.spool.remove(job_id)
    if not is_held:
        log.warning("job %s: not spooled: attempt %d no longer holds it", job_id, held.attempt)
        return "lease lost"
    runtime.held.spool(held, spooled)
    log.warning("job %s: image storage failed, its images wait in the spool: %s", job_id, why)
    metrics.JOBS.labels("spooled").inc()
    return "spooled"


def end_spooled_job(runtime: WorkerRuntime, held: HeldJob, failure: str | None) -> str:
    """End a job whose images waited in the spool: succeeded now that they are stored (`failure` None), else
    failed `storage_unavailable` for `failure`; then let it go. A Redis error leaves it waiting in the spool (the
    uploader tries again)."""
    assert held.spooled is not None
    spooled = held.spooled
    runtime.held.begin_ending(held)
    try:
        outcome = _end_spooled(runtime, held, spooled, failure)
    except StorageError:
        runtime.held.spool(held, spooled)
        raise
    runtime.spool.remove(held.job_id)
    runtime.held.let_go(held)
    return outcome


def _end_spooled(runtime: WorkerRuntime, held: HeldJob, spooled: SpooledJob, failure: str | None) -> str:
    record = patiently(runtime, runtime.job_store.get, spooled.job_id)
    if record is None:
        return "deleted"
    cleared = {"storing_since": None, "storing_reason": None}
    if failure is not None:
        return end_job(
            runtime, held, record, JobState.FAILED, error_code="storage_unavailable", error_message=failure, **cleared
        )
    timings = dict(spooled.timings)
    timings["storing"] = max(0.0, time.time() - (record.storing_since or spooled.spooled_at))
    timings["total"] = time.time() - record.created_at
    return end_job(
        runtime,
        held,
        record,
        JobState.SUCCEEDED,
        image_keys=spooled.image_keys,
        timings=timings,
        progress_step=spooled.steps,
        progress_total=spooled.steps,
        **cleared,
    )
