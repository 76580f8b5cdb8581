"""The generate task: one job from its queued record to an end state.

A generate message is a ticket for its model's queue, not for one job: the job it names is the one
whose arrival sent it (for logs and Flower), and the job it runs is the queue's next one in the
project's own order (highest priority, then fair share across tenants: `storage.fair_share`).
Every queued job is matched by a message, so any message may run any job of its queue.

1. take the queue's next job (atomic queued -> running with a lease); with none queued (its job was
   canceled, or taken by another message) the message does nothing, so a redelivered one is harmless;
2. a job whose deadline passed before it started ends `expired`;
3. submit it to this process's engine and wait, writing progress and watching for a cancel
   request (`worker.job_watch`);
4. encode and upload the images here, on the task thread, then mark the job `succeeded`; if the image store
   fails, the job stays running with its images in this worker's spool until they are stored
   (`worker.spool`, `end_spooled_job`).

Engine errors end the job `failed` with the engine's message. A job that drain or warm
shutdown stops before it finishes goes back to the queue for any worker.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from core.errors import EngineShutdownError, InvalidParamsError, JobCanceledError
from core.params import GenerationParams
from storage.errors import StorageError, StorageUnavailableError
from storage.job_record import JobRecord, JobState
from storage.queue_names import GENERATE_TASK
from storage.webhooks import EVENT_FOR_STATE
from worker import metrics
from worker.active_job import ActiveJob, StopReason
from worker.app import app
from worker.generate_messages import send_generate, send_ticket
from worker.input_images import with_input_images
from worker.job_watch import JobWatch
from worker.outage_retry import retry_through_outage
from worker.output_images import OutputImage, encode_outputs, output_images
from worker.runtime import WorkerRuntime, get_runtime
from worker.spool import SpooledJob
from worker.webhooks import emit_event

log = logging.getLogger(__name__)

STORAGE_RETRY_SECONDS = 5
SPOOL_FULL_WAIT_SECONDS = 5.0  # a message waits this long for room in a full spool before passing its job on


@app.task(name=GENERATE_TASK, bind=True, max_retries=None)
def generate(self, job_id: str) -> str:
    """`job_id`: the job whose arrival sent this message. Returns what this delivery did (for logs and Flower)."""
    try:
        return run_job(get_runtime(), job_id)
    except StorageUnavailableError as e:
        # Before the job was taken nothing changed: try the message again later. After it was
        # taken, its lease lapses and another worker's lease sweeper re-queues it.
        log.warning("job %s: Redis unavailable (%s); retrying in %ds", job_id, e, STORAGE_RETRY_SECONDS)
        raise self.retry(countdown=STORAGE_RETRY_SECONDS) from e


def patiently(runtime: WorkerRuntime, call, *args, **kwargs):
    """Record I/O that rides out a short Redis outage (`worker.outage_retry`)."""
    return retry_through_outage(runtime.settings.redis_retry_seconds, call, *args, **kwargs)


def run_job(runtime: WorkerRuntime, message_job_id: str) -> str:
    store = runtime.job_store
    queue = runtime.settings.queue
    if not runtime.wait_to_take_jobs(SPOOL_FULL_WAIT_SECONDS):  # drained, shutting down or its spool full
        send_ticket(queue, message_job_id)  # leave the queue's next job to another worker
        return "passed on"
    taken = patiently(runtime, store.take_next, queue, runtime.worker_id, runtime.lease_seconds)
    if taken is None:
        log.info("message of job %s: no job of its queue is queued; nothing to do", message_job_id)
        metrics.JOBS.labels("skipped").inc()
        return "nothing queued"
    job_id = taken.job_id
    if job_id != message_job_id:
        log.info("message of job %s: took job %s, next in its queue", message_job_id, job_id)
    runtime.leases.hold(job_id)
    try:
        return run_taken_job(runtime, taken)
    except StorageError:
        raise  # the job's lease lapses and a lease sweeper re-queues it
    except Exception as e:  # a bug must end the job readably, not leave it running
        log.exception("job %s: worker error", job_id)
        return end_job(
            runtime, taken, JobState.FAILED, error_code="worker_error", error_message=f"{type(e).__name__}: {e}"
        )
    finally:
        if not runtime.spool.holds(job_id):  # a spooled job keeps its lease until its images are stored
            runtime.leases.release(job_id)


def run_taken_job(runtime: WorkerRuntime, record: JobRecord) -> str:
    job_id = record.job_id
    if record.deadline is not None and record.first_started_at > record.deadline:
        late = record.first_started_at - record.deadline
        return end_job(
            runtime,
            record,
            JobState.EXPIRED,
            error_code="deadline_exceeded",
            error_message=f"the job did not start before its deadline ({late:.1f}s late)",
        )
    emit_event(record, "started")
    try:
        params = GenerationParams.from_dict(with_input_images(record.params, record.tenant, runtime.uploads))
    except InvalidParamsError as e:
        return end_job(runtime, record, JobState.FAILED, error_code="invalid_params", error_message=str(e))
    if params.lora is not None:
        lora_key = runtime.resolve_lora(record.tenant, params.lora)
        if lora_key is None:  # deleted since submit, or no store: the same answer as for a missing adapter
            return end_job(
                runtime,
                record,
                JobState.FAILED,
                error_code="invalid_params",
                error_message=f"LoRA adapter {params.lora!r} does not exist",
            )
        params = dataclasses.replace(params, lora=lora_key)
    try:
        active = runtime.submit(
            job_id,
            params,
            priority=record.priority,
            tenant=record.tenant,
            complete_by=record.complete_by,
            preview_every=record.preview_every,
        )
    except InvalidParamsError as e:  # for example a model this worker does not serve
        return end_job(runtime, record, JobState.FAILED, error_code="invalid_params", error_message=str(e))
    if active is None:
        return requeue(runtime, record, "admission is stopped")
    return run_in_engine(runtime, record, active)


def run_in_engine(runtime: WorkerRuntime, record: JobRecord, active: ActiveJob) -> str:
    job_id = record.job_id
    watch = JobWatch(runtime, active, record)
    try:
        result = watch.wait()
    except JobCanceledError:
        if active.stop_reason is StopReason.REQUEUE:
            return requeue(runtime, record, "admission stopped before it finished")
        if active.stop_reason is StopReason.LEASE_LOST:
            metrics.JOBS.labels("lease_lost").inc()
            return "lease lost"
        return end_job(
            runtime,
            record,
            JobState.CANCELED,
            progress_step=active.step,
            progress_total=active.total,
            error_code="canceled",
            error_message=f"canceled at step {active.step}/{active.total}",
        )
    except EngineShutdownError:
        return requeue(runtime, record, "the engine shut down")
    except Exception as e:  # one job's failure must not take the worker down
        log.exception("job %s: engine error", job_id)
        runtime.cancel_in_engine(active)  # the watch failed (a preview that would not encode, say): stop its steps
        return end_job(
            runtime, record, JobState.FAILED, error_code="engine_error", error_message=str(e) or type(e).__name__
        )
    finally:
        runtime.release_active(job_id)

    engine_seconds = time.monotonic() - active.submitted_at
    engine_timings = dict(result.timings)
    metrics.QUEUE_WAIT.observe(_queue_wait(record, engine_timings))
    upload_started = time.perf_counter()
    params = result.params
    try:
        encoded = encode_outputs(result)
        encode_seconds = time.perf_counter() - upload_started
        images = output_images(
            runtime.image_store, job_id, encoded, list(result.seeds), params.model, params.output_format
        )
        storage_error = runtime.spool.store_or_why(runtime.image_store, images)  # None: stored
    except Exception as e:
        log.exception("job %s: upload failed", job_id)
        return end_job(
            runtime,
            record,
            JobState.FAILED,
            error_code="upload_failed",
            error_message=f"the image could not be stored: {e}",
        )
    upload_seconds = time.perf_counter() - upload_started
    metrics.UPLOAD_SECONDS.observe(upload_seconds)
    timings = {
        "queue_wait": _queue_wait(record, engine_timings),
        "start": active.handed_over_at - record.first_started_at,
        "engine": engine_seconds,
        "engine_wait": float(engine_timings.get("queue_wait", 0.0)),
        "denoise": float(engine_timings.get("denoise", 0.0)),
        "decode": float(engine_timings.get("decode", 0.0)),
        "encode": encode_seconds,
        "upload": upload_seconds,
    }
    if storage_error is not None:
        spooled = SpooledJob(
            job_id,
            [image.key for image in images],
            [image.metadata for image in images],
            steps=active.total,
            timings=timings,
            spooled_at=time.time(),
        )
        return keep_in_spool(runtime, record, spooled, images, storage_error)
    image_keys = [image.key for image in images]
    timings["total"] = time.time() - record.created_at
    outcome = end_job(
        runtime,
        record,
        JobState.SUCCEEDED,
        image_keys=image_keys,
        timings=timings,
        progress_step=active.total,
        progress_total=active.total,
    )
    flush_images(runtime, job_id, image_keys)
    return outcome


def flush_images(runtime: WorkerRuntime, job_id: str, image_keys: list[str]) -> None:
    try:
        runtime.image_store.flush(image_keys)  # after the end state: off the job's latency (storage.image_store)
    except StorageError as e:
        log.warning("job %s: %s", job_id, e)


def keep_in_spool(
    runtime: WorkerRuntime, record: JobRecord, spooled: SpooledJob, images: list[OutputImage], why: str
) -> str:
    """The image store failed: the job stays running, its images in this worker's spool (worker.spool) until the
    spool's uploader stores them and ends it (`end_spooled_job`). Its lease stays held meanwhile."""
    job_id = record.job_id
    if not patiently(runtime, runtime.job_store.set_storing, job_id, runtime.worker_id, why):
        log.warning("job %s: not spooled: this worker no longer holds it", job_id)
        return "lease lost"
    runtime.spool.add(spooled, images, why)
    log.warning("job %s: image storage failed, its images wait in the spool: %s", job_id, why)
    metrics.JOBS.labels("spooled").inc()
    return "spooled"


def end_spooled_job(runtime: WorkerRuntime, spooled: SpooledJob, failure: str | None) -> str:
    """End a job whose images waited in the spool: succeeded now that they are stored (`failure` None), else
    failed `storage_unavailable` for `failure`."""
    record = patiently(runtime, runtime.job_store.get, spooled.job_id)
    if record is None:
        return "deleted"
    cleared = {"storing_since": None, "storing_reason": None}
    if failure is not None:
        return end_job(
            runtime, record, JobState.FAILED, error_code="storage_unavailable", error_message=failure, **cleared
        )
    timings = dict(spooled.timings)
    timings["storing"] = max(0.0, time.time() - (record.storing_since or spooled.spooled_at))
    timings["total"] = time.time() - record.created_at
    outcome = end_job(
        runtime,
        record,
        JobState.SUCCEEDED,
        image_keys=spooled.image_keys,
        timings=timings,
        progress_step=spooled.steps,
        progress_total=spooled.steps,
        **cleared,
    )
    flush_images(runtime, spooled.job_id, spooled.image_keys)
    return outcome


def _queue_wait(record: JobRecord, engine_timings: dict) -> float:
    """Time spent waiting for a worker (over all attempts: never an earlier attempt's run time), plus the
    engine's own wait on this attempt."""
    queued = record.queued_seconds if record.queued_seconds is not None else record.first_started_at - record.created_at
    return queued + float(engine_timings.get("queue_wait", 0.0))


def end_job(runtime: WorkerRuntime, record: JobRecord, state: JobState, **fields) -> str:
    """Record the job's end state (only if this worker still holds it) and announce it."""
    runtime.leases.release(record.job_id)  # the end state replaces the lease
    if not patiently(runtime, runtime.job_store.finish, record.job_id, state, worker_id=runtime.worker_id, **fields):
        if patiently(runtime, runtime.job_store.was_deleted, record.job_id):
            runtime.image_store.delete_job_images(record.job_id)  # what it stored before it learned it
            log.info("job %s: deleted by its tenant while it ran; its images removed", record.job_id)
            return "deleted"
        log.warning("job %s: not marked %s: this worker no longer holds it", record.job_id, state.value)
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
    return state.value


def requeue(runtime: WorkerRuntime, record: JobRecord, why: str) -> str:
    """Put a job this worker holds back in its queue, at its priority, for any worker."""
    runtime.leases.release(record.job_id)
    store = runtime.job_store
    job_id = record.job_id
    reason = "worker_shutdown" if runtime.is_shutting_down else "worker_drained"
    message = f"{runtime.worker_id}: {why}"
    if not patiently(runtime, store.release, job_id, runtime.worker_id, reason, message):
        record = patiently(runtime, store.get, job_id)
        if record is not None and record.state is JobState.CANCELED:  # a cancel request won over the re-queue
            metrics.JOBS.labels("canceled").inc()
            emit_event(record, "canceled")
            return "canceled"
        log.info("job %s: not re-queued (%s): another worker holds it", job_id, why)
        return "not requeued"
    send_generate(record)
    patiently(runtime, store.mark_sent, job_id)
    log.info("job %s: re-queued (%s)", job_id, why)
    metrics.JOBS.labels("requeued").inc()
    return "requeued"
