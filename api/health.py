"""Liveness and readiness: /healthz answers while the process runs; /readyz checks Redis and storage.

/readyz also says whether any worker is running (`workers`, and a warning when none was seen within
STEPWISE_WORKER_TIMEOUT), but does not fail for it: this API can still take jobs, which wait in
their queues until a worker starts, and an orchestrator must not restart the API for a missing worker.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint

from api.resources import get_image_store, get_job_store, get_settings
from api.views import iso_time
from storage.errors import StorageError

log = logging.getLogger(__name__)

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    return {"status": "ok"}


def storage_reachable() -> bool:
    try:
        return bool(get_image_store().ping())
    except Exception as e:  # any failure means "not ready", and readiness must never raise
        log.warning("image storage is not reachable: %s", e)
        return False


def worker_readiness() -> tuple[dict[str, Any] | None, list[str]]:
    try:
        statuses = get_job_store().models()
    except StorageError:
        return None, []
    available = [status for status in statuses if status.available]
    workers = {
        "seen_recently": bool(available),
        "num_workers": sum(status.workers for status in available),
        "available_models": [status.model for status in available],
        "last_seen": iso_time(max((status.last_seen for status in statuses), default=None)),
    }
    warnings = []
    if not available:
        timeout = get_settings().storage.worker_timeout
        warnings.append(
            f"no worker has been seen in the last {timeout:.0f}s: submitted jobs wait in the queue until one starts"
        )
    return workers, warnings


@bp.get("/readyz")
def readyz():
    checks = {"redis": get_job_store().ping(), "storage": storage_reachable()}
    if all(checks.values()):
        workers, warnings = worker_readiness()
        return {"status": "ok", "checks": checks, "workers": workers, "warnings": warnings}
    failing = ", ".join(name for name, ok in checks.items() if not ok)
    body = {
        "status": "unavailable",
        "checks": checks,
        "error": {"code": "unavailable", "message": f"not ready: {failing} unreachable"},
    }
    return body, 503, {"Retry-After": "5"}
