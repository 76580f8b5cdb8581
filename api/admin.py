"""Operator routes under /v1/admin, for admin API keys only (STEPWISE_ADMIN_API_KEYS or
`stepwise keys create --admin`)."""

from __future__ import annotations

from flask import Blueprint

from api.auth import require_admin
from api.openapi_operations import Answer, api_errors, documented
from api.resources import get_job_store
from api.schemas import TenantTotalsList

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
