"""The steps of a taken job's straight line (`worker.tasks.run_taken_job`), in the order it takes them.

Each returns what the next step needs, or raises the way out it found (`worker.ways_out`): the job expired, its
parameters or adapter are invalid, the engine failed or stopped it, its images could not be stored.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from core.errors import EngineShutdownError, InvalidParamsError, JobCanceledError
from core.params import GenerationParams
from storage.errors import StorageError
from storage.job_record import JobRecord, JobState
from worker import metrics
from worker.held_job import HeldJob, StopReason
from worker.input_images import with_input_images
from worker.job_watch import JobWatch
from worker.output_images import OutputImage, encode_outputs, output_images, put_images
from worker.runtime import WorkerRuntime
from worker.spool import SpooledJob
from worker.ways_out import BackToQueue, Ends, LeaseLost, WaitsInSpool, WayOut

if TYPE_CHECKING:
    from batching.job import GenerationResult

log = logging.getLogger(__name__)


def check_deadline(record: JobRecord) -> None:
    """A job whose deadline passed before it started ends `expired`."""
    if record.deadline is not None and record.first_started_at > record.deadline:
        late = record.first_started_at - record.deadline
        message = f"the job did not start before its deadline ({late:.1f}s late)"
        raise Ends(JobState.EXPIRED, {"error_code": "deadline_exceeded", "error_message": message})


def params_to_run(runtime: WorkerRuntime, record: JobRecord) -> GenerationParams:
    """The job's parameters with its input images read and its adapter's store key."""
    try:
        params = GenerationParams.from_dict(with_input_images(record.params, record.tenant, runtime.uploads))
    except InvalidParamsError as e:
        raise Ends.failed("invalid_params", str(e)) from e
    if params.lora is None:
        return params
    lora_key = runtime.resolve_lora(record.tenant, params.lora)
    if lora_key is None:  # deleted since submit, or no store: the same answer as for a missing adapter
        raise Ends.failed("invalid_params", f"LoRA adapter {params.lora!r} does not exist")
    return dataclasses.replace(params, lora=lora_key)


def start_in_engine(runtime: WorkerRuntime, held: HeldJob, record: JobRecord, params: GenerationParams) -> None:
    try:
        is_started = runtime.submit(
            held, params, priority=record.priority, complete_by=record.complete_by, preview_every=record.preview_every
        )
    except InvalidParamsError as e:  # for example a model this worker does not serve
        raise Ends.failed("invalid_params", str(e)) from e
    if not is_started:
        raise BackToQueue("admission is stopped") if held.stop_reason is None else _why_stopped(held)


def wait_in_engine(runtime: WorkerRuntime, held: HeldJob, record: JobRecord) -> GenerationResult:
    """The engine's result, while the job's watch writes its progress and previews and passes on a cancel."""
    try:
        return JobWatch(runtime, held, record).wait()
    except JobCanceledError as e:
        raise _why_stopped(held) from e
    except EngineShutdownError as e:
        raise BackToQueue("the engine shut down") from e
    except Exception as e:  # one job's failure must not take the worker down
        log.exception("job %s: engine error", record.job_id)
        runtime.cancel_in_engine(held)  # the watch failed (a write raised what it should not, say): stop its steps
        raise Ends.failed("engine_error", str(e) or type(e).__name__) from e
    finally:
        runtime.held.leave_engine(held)


def _why_stopped(held: HeldJob) -> WayOut:
    if held.stop_reason is StopReason.REQUEUE:
        return BackToQueue("admission stopped before it finished")
    if held.stop_reason is StopReason.LEASE_LOST:
        return LeaseLost()
    progress = {"progress_step": held.step, "progress_total": held.total}
    message = f"canceled at step {held.step}/{held.total}"
    return Ends(JobState.CANCELED, {**progress, "error_code": "canceled", "error_message": message})


def store_outputs(runtime: WorkerRuntime, held: HeldJob, record: JobRecord, result: GenerationResult) -> Ends:
    """Encode the job's outputs and put them in the image store: the job's success, with its images and timings.
    If the store fails, its images go to the spool instead (`WaitsInSpool`)."""
    job_id = record.job_id
    engine_seconds = time.monotonic() - held.submitted_at
    engine_timings = dict(result.timings)
    queue_wait = _queue_wait(record, engine_timings)
    metrics.QUEUE_WAIT.observe(queue_wait)
    upload_started = time.perf_counter()
    params = result.params
    try:
        encoded = encode_outputs(result)
        encode_seconds = time.perf_counter() - upload_started
        images = output_images(
            runtime.image_store, job_id, encoded, list(result.seeds), params.model, params.output_format
        )
        storage_error = store_or_why(runtime, images)  # None: stored
    except Exception as e:
        log.exception("job %s: upload failed", job_id)
        raise Ends.failed("upload_failed", f"the image could not be stored: {e}") from e
    upload_seconds = time.perf_counter() - upload_started
    metrics.UPLOAD_SECONDS.observe(upload_seconds)
    timings = {
        "queue_wait": queue_wait,
        "start": held.handed_over_at - held.taken_at,  # this attempt's: from its take to the engine
        "engine": engine_seconds,
        "engine_wait": float(engine_timings.get("queue_wait", 0.0)),
        "denoise": float(engine_timings.get("denoise", 0.0)),
        "decode": float(engine_timings.get("decode", 0.0)),
        "encode": encode_seconds,
        "upload": upload_seconds,
    }
    image_keys = [image.key for image in images]
    if storage_error is not None:
        metadata = [image.metadata for image in images]
        spooled = SpooledJob(
            job_id, held.holder, image_keys, metadata, steps=held.total, timings=timings, spooled_at=time.time()
        )
        raise WaitsInSpool(spooled, images, storage_error)
    timings["total"] = time.time() - record.created_at
    progress = {"progress_step": held.total, "progress_total": held.total}
    return Ends(JobState.SUCCEEDED, {"image_keys": image_keys, "timings": timings, **progress})


def store_or_why(runtime: WorkerRuntime, images: list[OutputImage]) -> str | None:
    """Put the images in the store; None if stored, else why not (then they belong in the spool). While jobs
    wait in the spool the store is not tried: it failed lately, and the spool's uploader finds out when it is
    back."""
    num_spooled = len(runtime.held.spooled())
    if num_spooled:
        return f"waiting behind {num_spooled} spooled jobs for image storage: {runtime.spool.last_error}"
    try:
        put_images(runtime.image_store, images)
    except StorageError as e:
        why = str(e) or type(e).__name__
        runtime.spool.note_error(why)  # the store's own error: what later jobs' reasons quote, once
        return why
    return None


def _queue_wait(record: JobRecord, engine_timings: dict) -> float:
    """Time spent waiting for a worker (over all attempts: never an earlier attempt's run time), plus the
    engine's own wait on this attempt."""
    queued = record.queued_seconds if record.queued_seconds is not None else record.first_started_at - record.created_at
    return queued + float(engine_timings.get("queue_wait", 0.0))
