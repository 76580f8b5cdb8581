"""Operator routes under /v1/admin, for admin API keys only (STEPWISE_ADMIN_API_KEYS or
`stepwise keys create --admin`)."""

from __future__ import annotations

from flask import Blueprint

from api.answers import ModelLoad, TenantTotalsList
from api.auth import require_admin
from api.openapi_operations import Answer, api_errors, documented, query_of
from api.resources import get_job_store
from api.schemas import ScalingQuery
from storage.queue_names import generate_queue

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")
bp.before_request(require_admin)


@bp.get("/tenants")
@documented(
    "Every tenant's queued and running jobs (an admin API key).",
    responses={200: Answer("Per tenant.", TenantTotalsList)},
    errors=api_errors(503),
)
def tenant_totals():
    """Every tenant's queued and running jobs now (tenants without any are left out)."""
    totals = get_job_store().tenant_totals()
    return {"tenants": [{"tenant": tenant, **counts} for tenant, counts in totals.items()]}


@bp.get("/scaling")
@documented(
    "One model's queued and running jobs now, an autoscaler's signal (an admin API key; KEDA's metrics-api "
    "scaler in deploy/kubernetes).",
    query=ScalingQuery,
    responses={200: Answer("The model's load.", ModelLoad)},
    errors=api_errors(422, 503),
)
def model_load():
    """One model's queued and running jobs now: the signal KEDA's metrics-api scaler reads to size that model's
    workers from zero (`jobs` over one worker's capacity; deploy/kubernetes, docs/scaling.md). Read from Redis
    at each request, so every API process answers the same; zero when the model is idle."""
    model = query_of(ScalingQuery).model
    store = get_job_store()
    load = store.model_load(generate_queue(model))
    workers = sum(status.workers for status in store.models() if status.model == model)
    return {
        "model": model,
        "queued": load.num_queued,
        "running": load.num_running,
        "jobs": load.num_jobs,
        "workers": workers,
    }
