"""The project's own remote commands, used through Celery's command-line tools:

    celery -A worker inspect engine_stats   # the engine's batching statistics, per worker
    celery -A worker control drain          # stop admitting jobs (maintenance)
    celery -A worker control resume         # admit jobs again

`drain` stops consuming its model's generate queue, pauses the engine's admission and sends jobs
that have not started denoising back to the queue (another worker, or this one after
`resume`, runs them); jobs already denoising finish. Webhook deliveries continue.

A worker that runs no engine (webhook delivery only) answers each of them with a plain "ok" saying
so, not an error: a fleet-wide `celery inspect engine_stats` or `control drain` reaches it too, and
nothing is wrong with it.
"""

from __future__ import annotations

import logging

from celery.worker.control import control_command, inspect_command

from worker.app import generate_queue
from worker.heartbeat import beat_now
from worker.runtime import current_runtime

log = logging.getLogger(__name__)

NO_ENGINE = {"ok": "no engine here: this worker only delivers webhooks"}


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
    state.consumer.call_soon(state.consumer.cancel_task_queue, generate_queue)
    requeued = runtime.stop_admission()
    beat_now()
    log.info("drain: stopped admitting jobs; re-queued %d that had not started", len(requeued))
    return {
        "ok": "draining",
        "requeued_job_ids": requeued,
        "running_job_ids": [active.job_id for active in runtime.active_jobs()],
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
    state.consumer.call_soon(state.consumer.add_task_queue, generate_queue)
    beat_now()
    log.info("resume: admitting jobs again")
    return {"ok": "admitting"}
