"""The application's shared resources, one named getter each (flaskr's `get_db()` style).

`create_app` builds every resource once, from settings read once at start, and keeps it on
`app.extensions`; routes reach them only through these getters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flask import Flask, current_app

if TYPE_CHECKING:
    from api.celery_client import TaskQueue
    from api.fleet import Fleet
    from api.keyring import KeyRing
    from api.settings import ApiSettings
    from storage.image_store import ImageStore
    from storage.job_events import JobEventLog
    from storage.job_store import JobStore
    from storage.lora_store import LoraStore
    from storage.upload_store import UploadStore

_KEYS = (
    "settings",
    "keyring",
    "job_store",
    "fleet",
    "upload_store",
    "image_store",
    "lora_store",
    "task_queue",
    "openapi_document",
    "job_events",
)


def install(app: Flask, **resources: Any) -> None:
    assert set(resources) == set(_KEYS), f"resources must be exactly {_KEYS}"
    for name, value in resources.items():
        app.extensions[f"stepwise.{name}"] = value


def get_settings() -> ApiSettings:
    return current_app.extensions["stepwise.settings"]


def get_keyring() -> KeyRing:
    return current_app.extensions["stepwise.keyring"]


def get_job_store() -> JobStore:
    return current_app.extensions["stepwise.job_store"]


def get_fleet() -> Fleet:
    return current_app.extensions["stepwise.fleet"]


def get_image_store() -> ImageStore:
    return current_app.extensions["stepwise.image_store"]


def get_upload_store() -> UploadStore:
    return current_app.extensions["stepwise.upload_store"]


def get_task_queue() -> TaskQueue:
    return current_app.extensions["stepwise.task_queue"]


def get_openapi_document() -> dict[str, Any]:
    return current_app.extensions["stepwise.openapi_document"]


def get_job_events() -> JobEventLog:
    return current_app.extensions["stepwise.job_events"]


def get_lora_store() -> LoraStore | None:
    return current_app.extensions["stepwise.lora_store"]
