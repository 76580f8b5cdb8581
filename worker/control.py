"""The project's own remote commands, used through Celery's command-line tools:

    celery -A worker inspect engine_stats   # the engine's batching statistics, per worker
    celery -A worker control drain          # stop admitting jobs (maintenance)
    celery -A worker control resume         # admit jobs again

and two of Celery's own, answered in the project's terms, so Celery users' habits work on jobs:

    celery -A worker inspect active         # the jobs each worker runs, with their progress
    celery -A worker control revoke JOB_ID  # cancel the job at its next step, wherever it runs

A job is not a Celery task (a worker's feeder takes jobs from its model's queue in the project's own
order), so Celery's `active` would not list it, and its `revoke` would not stop it: `active`
lists the jobs an engine worker holds (its held-jobs book, `worker.held_jobs`), as Celery lists tasks (plus
`progress`, `tenant`, `stage` and `attempt`), and the worker's webhook deliveries as Celery does; `revoke`
cancels each id that names a job as `POST /v1/jobs/{id}/cancel` does (a queued job at once; a running one at
its next step: its own worker stops it at once, any other through the cancel flag within a poll interval), and
hands every other id to Celery's own revoke.

`drain` stops the feeder taking jobs from its model's queue (`worker.feeder`), pauses the engine's
admission and sends jobs that have not started denoising back to the queue (another worker, or this
one after `resume`, runs them); jobs already denoising finish. Webhook deliveries continue.

A worker that runs no engine (webhook delivery only) answers each of them with a plain "ok" saying
so, not an error: a fleet-wide `celery inspect engine_stats` or `control drain` reaches it too, and
nothing is wrong with it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Literal

from celery.utils.functional import maybe_list
from celery.worker import control as celery_control
from celery.worker.control import control_command, inspect_command

from storage.errors import InvalidTransitionError, JobNotFoundError
from storage.job_record import JobState
from worker.app import settings
from worker.heartbeat import beat_now
from worker.held_job import HeldJob, StopReason
from worker.runtime import WorkerRuntime, current_runtime

log = logging.getLogger(__name__)

NO_ENGINE = {"ok": "no engine here: this worker only delivers webhooks"}
JOB_NAME = "stepwise.job"  # a held job's `name` in `inspect active` (no Celery task runs it: a job thread does)

_celery_active = celery_control.active  # Celery's own, before `active` below replaces it
_celery_revoke = celery_control.revoke


@inspect_command(alias="dump_active")
def active(state, safe: bool = False, **kwargs) -> list[dict[str, Any]]:
    """The jobs this worker holds (Celery's task fields, plus progress, tenant, stage and attempt), and its
    tasks (webhook deliveries)."""
    tasks = _celery_active(state, safe=safe, **kwargs)
    runtime = current_runtime()
    if runtime is None or not runtime.runs_engine:
        return tasks
    hostname = state.consumer.hostname
    return [job_info(runtime, held, hostname) for held in runtime.held.all()] + tasks


def job_info(runtime: WorkerRuntime, held: HeldJob, hostname: str) -> dict[str, Any]:
    """One held job, in the fields Celery's `inspect active` gives a task (Flower reads them too)."""
    return {
        "id": held.job_id,
        "name": JOB_NAME,
        "type": JOB_NAME,
        "args": [held.job_id],
        "kwargs": {},
        "hostname": hostname,
        "time_start": held.taken_at,
        "acknowledged": True,
        "delivery_info": {"routing_key": settings.queue, "priority": None, "redelivered": False},  # its model's
        "worker_pid": os.getpid(),
        "progress": f"{held.step}/{held.total}",
        "tenant": held.tenant,
        "stage": held.stage.value,  # taken, in_engine, storing, spooled or ending (worker.held_job)
        "attempt": held.attempt,
    }


@control_command(variadic="task_id", signature="[id1 [id2 [... [idN]]]]")
def revoke(state, task_id, terminate: bool = False, signal=None, **kwargs) -> dict[str, Any]:
    """Cancel each id that names a job (at its next step, wherever it runs); revoke other ids as Celery does.

    Every worker gets the command; each answers for itself: "canceled" only where it ended the job (the worker
    that holds it, or any engine worker for a job still queued), "not held here" where it only recorded the
    cancel. A worker that runs no engine (webhooks only) leaves jobs alone and treats every id as Celery does."""
    runtime = current_runtime()
    ids = list(maybe_list(task_id) or [])
    outcomes = {job_id: cancel_job(runtime, job_id) for job_id in ids} if runtime and runtime.runs_engine else {}
    canceled = [job_id for job_id, outcome in outcomes.items() if outcome == "canceled"]
    elsewhere = [job_id for job_id, outcome in outcomes.items() if outcome == "not held here"]
    others = [task for task in ids if outcomes.get(task) in (None, "no such job")]
    if others:
        _celery_revoke(state, others, terminate=terminate, signal=signal, **kwargs)
    said = [
        *([f"jobs {canceled} canceled"] if canceled else []),
        *([f"jobs {elsewhere} not held here (cancel recorded; their worker stops them)"] if elsewhere else []),
        *([f"tasks {others} flagged as revoked"] if others else []),
    ]
    return {"ok": "; ".join(said)}


CancelOutcome = Literal["canceled", "not held here", "no such job"]


def cancel_job(runtime: WorkerRuntime, job_id: str) -> CancelOutcome:
    """Cancel `job_id` as the API does, and stop it here at once if this worker holds it. Returns what this worker
    did: "canceled" (it held the job, or the job was still queued), "not held here" (running elsewhere, or
    already ended) or "no such job"."""
    try:
        state = runtime.job_store.request_cancel(job_id)
    except JobNotFoundError:
        return "no such job"
    except InvalidTransitionError:  # already ended (another worker's revoke may have done it)
        state = None
    held = runtime.held.get(job_id)
    if held is not None:
        runtime.stop_job(held, StopReason.CANCELED)
        log.info("revoke: job %s stops at its next step", job_id)
        return "canceled"
    return "canceled" if state is JobState.CANCELED else "not held here"


@inspect_command()
def engine_stats(state) -> dict:
    """Running jobs per compatibility key, waiting jobs, rows per forward, steps per second, model."""
    runtime = current_runtime()
    if runtime is None or not runtime.runs_engine:
        return dict(NO_ENGINE)
    return runtime.stats()


@control_command()
def drain(state) -> dict:
    """Stop admitting new jobs; jobs already denoising finish."""
    runtime = current_runtime()
    if runtime is None or not runtime.runs_engine:
        return dict(NO_ENGINE)
    requeued = runtime.stop_admission()
    beat_now()
    log.info("drain: stopped admitting jobs; re-queued %d that had not started", len(requeued))
    return {
        "ok": "draining",
        "requeued_job_ids": requeued,
        "running_job_ids": [held.job_id for held in runtime.held.before_or_in_engine()],
    }


@control_command()
def resume(state) -> dict:
    """Admit new jobs again after `drain`."""
    runtime = current_runtime()
    if runtime is None or not runtime.runs_engine:
        return dict(NO_ENGINE)
    if runtime.is_shutting_down:
        return {"error": "this worker is shutting down"}
    runtime.resume_admission()
    beat_now()
    log.info("resume: admitting jobs again")
    return {"ok": "admitting"}
