"""The HTTP API: a Flask application factory.

Resources (the job store, the fleet view, the image store, the Celery client, the key ring,
the OpenAPI document) are created once per application from settings read once, and routes reach
them through the named getters of `api.resources`.

Where things are: `api.job_view` turns a job record into the JSON a client sees; each route
module is one blueprint named by its resource (`jobs`, `uploads`, `loras`, `served_models` for
`GET /v1/models`, `openai_images`, `openai_videos`, `health`, `web`); `api.celery_client` sends tasks by name.
`create_app` is in `api.app`, imported on first use, so that `api.settings` alone stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    """`create_app` on first use (api.app): importing `api.settings` alone imports no route and no Flask."""
    if name == "create_app":
        from api.app import create_app

        return create_app
    raise AttributeError(f"module 'api' has no attribute {name!r}")
