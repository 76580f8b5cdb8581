"""Liveness and readiness: /healthz answers while the process runs; /readyz checks Redis and storage.

Ready means this API can take jobs, which needs Redis only: with image storage down it stays ready
(`checks.storage` false, and a warning), since jobs still run and their images wait in the workers'
spools (worker.spool) until storage is back. An orchestrator that took the API out of service for a
storage outage would refuse the very jobs the spool keeps.

/readyz also says which models this API serves (`models`: configured or seen, as submits decide) and
whether workers run them (`workers`, and a warning for each model without a live worker, with a
draining one, or with one whose spool of images waiting for storage is full), but does not fail for
it: jobs for those models wait in their queues until a worker takes them, and an orchestrator must not
restart the API for a missing worker.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint

from api.answers import Health, Readiness
from api.job_view import iso_time
from api.openapi_operations import Answer, documented
from api.resources import get_fleet, get_image_store, get_job_store, get_settings
from storage.errors import StorageError
from storage.heartbeats import ModelStatus

log = logging.getLogger(__name__)

bp = Blueprint("health", __name__)

STORAGE_DOWN_WARNING = (
    "image storage is unreachable: jobs are still accepted and run, their images wait in the workers' spools "
    "and the jobs succeed once storage is back; stored images cannot be fetched meanwhile"
)


@bp.get("/healthz")
@documented("The process is alive.", responses={200: Answer("Alive.", Health)})
def healthz():
    return {"status": "ok"}


def storage_reachable() -> bool:
    try:
        return bool(get_image_store().ping())
    except Exception as e:  # any failure means "not ready", and readiness must never raise
        log.warning("image storage is not reachable: %s", e)
        return False


def model_readiness(statuses: dict[str, ModelStatus]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each model this API serves (what submits accept) and what its workers do, with a warning for each
    one whose jobs will wait; the same `Fleet.accepts` decides both."""
    fleet, timeout = get_fleet(), get_settings().storage.worker_timeout
    models, warnings = [], []
    for model in fleet.served_models(statuses):
        status = statuses.get(model)
        num_workers, num_draining = (status.workers, status.draining) if status else (0, 0)
        models.append(
            {
                "model": model,
                "configured": model in get_settings().configured_models,
                "accepted": fleet.accepts(model, status),
                "available": num_workers > 0,
                "workers": num_workers,
                "draining": num_draining,
            }
        )
        if num_draining and not num_workers:
            warnings.append(
                f"model {model}: its {'worker is' if num_draining == 1 else f'{num_draining} workers are'} draining "
                "(`celery -A worker control resume` undoes it): its jobs are accepted and wait in the queue"
            )
        elif num_draining:
            warnings.append(f"model {model}: {num_draining} of {num_workers + num_draining} workers are draining")
        elif status is not None and status.spool_full:
            warnings.append(
                f"model {model}: {status.spool_full} of {num_workers} workers have a full spool (image storage is "
                "failing): they take no job until storage takes their images; queued jobs wait"
            )
        elif not num_workers:
            warnings.append(
                f"model {model}: no worker seen in the last {timeout:.0f}s: "
                "its jobs are accepted and wait in the queue until one starts"
            )
        for thread, why in (status.threads_failed if status else {}).items():
            warnings.append(f"model {model}: a worker's engine thread {thread} stopped ({why}); restart that worker")
    if get_settings().accept_unserved_models:
        if not any(status.available for status in statuses.values()):
            warnings.append(
                f"no worker has been seen in the last {timeout:.0f}s: submitted jobs wait in the queue until one starts"
            )
    elif not models:
        warnings.append(
            "no model is configured (STEPWISE_MODELS) and no worker has sent a heartbeat: "
            "every job is refused (422 naming model) until one does"
        )
    return models, warnings


def worker_readiness() -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[str]]:
    try:
        statuses = get_fleet().models(max_age=0)  # fresh: this is what operators and orchestrators watch
    except StorageError:
        return None, [], []
    available = [status for status in statuses.values() if status.available]
    workers = {
        "seen_recently": bool(available),
        "num_workers": sum(status.workers for status in available),
        "num_draining": sum(status.draining for status in statuses.values()),
        "num_spooling": sum(status.spooling for status in statuses.values()),
        "num_spool_full": sum(status.spool_full for status in statuses.values()),
        "available_models": [status.model for status in available],
        "last_seen": iso_time(max((status.last_seen for status in statuses.values()), default=None)),
    }
    models, warnings = model_readiness(statuses)
    return workers, models, warnings


@bp.get("/readyz")
@documented(
    "Redis and image storage are reachable; says whether workers run.",
    responses={200: Answer("Ready.", Readiness), 503: Answer("Not ready.", Readiness)},
)
def readyz():
    checks = {"redis": get_job_store().ping(), "storage": storage_reachable()}
    if checks["redis"]:
        workers, models, warnings = worker_readiness()
        if not checks["storage"]:
            warnings.insert(0, STORAGE_DOWN_WARNING)
        return {"status": "ok", "checks": checks, "workers": workers, "models": models, "warnings": warnings}
    body = {
        "status": "unavailable",
        "checks": checks,
        "error": {"code": "unavailable", "message": "not ready: redis unreachable"},
    }
    return body, 503, {"Retry-After": "5"}
