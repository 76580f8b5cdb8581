"""Liveness and readiness: /healthz answers while the process runs; /readyz checks Redis and storage."""

from __future__ import annotations

import logging

from flask import Blueprint

from api.resources import get_image_store, get_job_store

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


@bp.get("/readyz")
def readyz():
    checks = {"redis": get_job_store().ping(), "storage": storage_reachable()}
    if all(checks.values()):
        return {"status": "ok", "checks": checks}
    failing = ", ".join(name for name, ok in checks.items() if not ok)
    body = {"status": "unavailable", "checks": checks,
            "error": {"code": "unavailable", "message": f"not ready: {failing} unreachable"}}
    return body, 503, {"Retry-After": "5"}
