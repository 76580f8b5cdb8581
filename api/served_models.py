"""GET /v1/models: the models the workers serve, from their heartbeats (storage.heartbeats).

Any tenant may read it: it names models, families, counts and engine statistics, never a job
id or a prompt. The same list also comes in OpenAI's shape (`object: "list"`, `data: [{"id", "object": "model",
"created", "owned_by"}]`), so the `openai` client's `client.models.list()` reads it.

A model's `limits` are its family's rules from the worker's heartbeat with the API's own cost limits on top
(`max_pixels`, `max_pixel_steps`: api.limits, the table the API checks every job against), so what is
advertised is what is enforced.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from api.answers import ModelList
from api.auth import require_tenant
from api.job_view import iso_time
from api.openapi_operations import Answer, api_errors, documented
from api.resources import get_job_store, get_settings
from core.families import FAMILIES, recommended_sizes
from storage.heartbeats import ModelStatus

bp = Blueprint("models", __name__, url_prefix="/v1/models")
bp.before_request(require_tenant)


def model_view(status: ModelStatus) -> dict[str, Any]:
    limits = get_settings().limits.advertised(status.model)
    return {
        "model": status.model,
        "family": status.family,
        "available": status.available,
        "workers": status.workers,
        "draining": status.draining,
        "spooling": status.spooling,
        "spool_full": status.spool_full,
        "capacity": status.capacity,
        "queue_depth": status.queue_depth,
        "queued_by_priority": status.queued_by_priority,
        "last_seen": iso_time(status.last_seen),
        "defaults": status.defaults,
        "limits": {**status.limits, **limits},
        "sizes": recommended_sizes(status.model, status.family) if status.family in FAMILIES else [],
        "engine": status.engine,
    }


@bp.get("")
@documented(
    "The models workers serve (from their heartbeats), with queue depth and engine statistics.",
    responses={200: Answer("Served models, by name.", ModelList)},
    errors=api_errors(503),
)
def list_models():
    statuses = get_job_store().models()  # fresh: this is what operators watch
    return {
        "object": "list",
        "data": [openai_model(status) for status in statuses],
        "models": [model_view(status) for status in statuses],
    }


def openai_model(status: ModelStatus) -> dict[str, Any]:
    """One model as OpenAI's `GET /v1/models` lists it (`created`: when a worker last said it serves it)."""
    return {"id": status.model, "object": "model", "created": int(status.last_seen), "owned_by": "stepwise"}
