"""`celery -A worker control revoke JOB_ID` goes to every worker, and each answers for itself (in process: the
command's own function on real runtimes and real Redis): "canceled" only from the worker that ended the job, "not
held here" from the others, and nothing about jobs from a worker that only delivers webhooks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import Celery

from storage.job_record import JobState
from storage.settings import StorageSettings
from tests.support.job_factories import make_job, take_job
from worker import control
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings


@pytest.fixture
def runtimes(redis_url, tmp_path):
    """An engine worker's runtime holding no job, and a webhook worker's (no engine)."""
    settings = WorkerSettings(storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()))
    engine_worker = WorkerRuntime(settings, "gpu1@host", runs_engine=True)
    webhook_worker = WorkerRuntime(settings, "hooks@host", runs_engine=False)
    yield engine_worker, webhook_worker
    engine_worker.close()
    webhook_worker.close()


def revoke_on(runtime: WorkerRuntime, monkeypatch, job_id: str) -> str:
    """What this worker answers to `control revoke JOB_ID` (Celery's part reads task states from Redis)."""
    monkeypatch.setattr(control, "current_runtime", lambda: runtime)
    redis_url = runtime.settings.storage.redis_url
    app = Celery("revoke-test", broker=redis_url, backend=redis_url, set_as_current=False)
    try:
        return control.revoke(SimpleNamespace(app=app), [job_id])["ok"]
    finally:
        app.close()


def test_a_running_job_another_worker_holds_is_not_reported_canceled_here(runtimes, monkeypatch):
    engine_worker, webhook_worker = runtimes
    job = make_job(engine_worker.job_store)
    take_job(engine_worker.job_store, job.job_id, "gpu0@host")  # runs on another worker

    from_webhooks = revoke_on(webhook_worker, monkeypatch, job.job_id)
    assert not engine_worker.job_store.get(job.job_id).cancel_requested  # a webhook worker leaves jobs alone
    from_engine = revoke_on(engine_worker, monkeypatch, job.job_id)

    assert from_webhooks == f"tasks ['{job.job_id}'] flagged as revoked"
    assert from_engine == f"jobs ['{job.job_id}'] not held here (cancel recorded; their worker stops them)"
    assert engine_worker.job_store.get(job.job_id).cancel_requested  # its holder stops it at its next step


def test_a_queued_job_is_reported_canceled_once_by_the_worker_that_canceled_it(
    runtimes, redis_url, tmp_path, monkeypatch
):
    engine_worker, _ = runtimes
    settings = WorkerSettings(storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()))
    second_engine_worker = WorkerRuntime(settings, "gpu2@host", runs_engine=True)
    job = make_job(engine_worker.job_store)
    try:
        answers = [revoke_on(runtime, monkeypatch, job.job_id) for runtime in (engine_worker, second_engine_worker)]
    finally:
        second_engine_worker.close()

    assert answers == [
        f"jobs ['{job.job_id}'] canceled",
        f"jobs ['{job.job_id}'] not held here (cancel recorded; their worker stops them)",
    ]
    assert engine_worker.job_store.get(job.job_id).state is JobState.CANCELED
