"""What in-process API tests (create_app + test_client) read of the app's own resources."""

from __future__ import annotations

from api.resources import get_job_store, get_task_queue


def get_task_queue_of(app):
    with app.app_context():
        return get_task_queue()


def stored_params(app, job_id: str) -> dict:
    with app.app_context():
        return get_job_store().get(job_id).params
