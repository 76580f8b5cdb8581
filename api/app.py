"""`create_app`, the API application factory (`from api import create_app`), with every route module it registers.

Kept out of the package's `__init__` so that what reads only the API's settings (`stepwise api`'s granian main
process, which supervises the workers that serve the app, and the command line's other commands) does not import
Flask, the routes and the OpenAPI schemas."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Flask
from flask.json.provider import DefaultJSONProvider

from api import (
    admin,
    errors,
    health,
    jobs,
    loras,
    metrics,
    openai_images,
    openai_videos,
    openapi,
    resources,
    served_models,
    uploads,
    web,
)
from api.celery_client import TaskQueue
from api.fleet import Fleet
from api.keyring import KeyRing
from api.settings import ApiSettings
from storage.api_keys import ApiKeyStore, ApiKeyTable
from storage.image_store import open_image_store
from storage.job_events import JobEventLog
from storage.job_store import JobStore
from storage.lora_store import open_lora_store
from storage.upload_store import UploadStore


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """The API application. `test_config` updates `app.config`: its `API_SETTINGS` (an ApiSettings)
    replaces the environment, and `TESTING` raises unexpected errors into the test instead of answering 500."""
    app = Flask("api")  # the package's name: its static files, templates and logger, as before
    app.config.from_mapping(test_config or {})
    settings: ApiSettings = app.config.get("API_SETTINGS") or ApiSettings.from_env()
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.config["MAX_FORM_PARTS"] = settings.max_form_parts
    # A text part is bounded by its route's body limit alone, so a form that werkzeug refuses within that limit
    # has too many parts (api.request_body.read_form says so).
    app.config["MAX_FORM_MEMORY_SIZE"] = None
    assert isinstance(app.json, DefaultJSONProvider)  # Flask's own provider: it has these two settings
    app.json.sort_keys = False
    app.json.compact = True

    app.url_map.converters["jobid"] = jobs.JobIdConverter
    errors.register(app)
    metrics.register(app)
    blueprints = (
        jobs.bp,
        loras.bp,
        uploads.bp,
        served_models.bp,
        admin.bp,
        health.bp,
        openapi.bp,
        web.bp,
        openai_images.bp,
        openai_videos.bp,
    )
    for blueprint in blueprints:
        app.register_blueprint(blueprint)

    job_store = JobStore.from_settings(settings.storage)
    api_key_store = ApiKeyStore(job_store.redis, job_store.keys)  # `stepwise keys` manages them
    resources.install(
        app,
        settings=settings,
        keyring=KeyRing(settings.api_keys, settings.admin_api_keys, ApiKeyTable(api_key_store)),
        job_store=job_store,
        fleet=Fleet(job_store, settings),
        upload_store=UploadStore.beside(job_store),
        image_store=open_image_store(settings.storage),
        lora_store=open_lora_store(settings.storage),
        task_queue=TaskQueue(settings.storage.redis_url),
        openapi_document=openapi.build_document(app, settings),  # from the routes registered above
        job_events=JobEventLog(job_store.redis, job_store.keys),
    )
    return app
