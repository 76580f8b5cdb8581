"""The ways out of a taken job's straight line that no end-to-end test reaches, on a real runtime and engine in
this process: each ends the job once, readably, and lets go of its lease (`worker.tasks.run_held_job`)."""

from __future__ import annotations

import pytest

from batching import DiffusionEngine, EngineConfig
from storage.errors import StorageUnavailableError
from storage.job_record import JobState
from storage.job_store import JobStore
from storage.settings import StorageSettings
from tests.support.cluster import small_params
from worker import job_steps
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings
from worker.tasks import run_job


@pytest.fixture(scope="module")
def engine():
    engine = DiffusionEngine(EngineConfig(model="builtin:tiny", max_num_seqs=2, device="cpu"))
    yield engine
    engine.shutdown()


@pytest.fixture
def runtime(redis_url, tmp_path, engine):
    settings = WorkerSettings(
        storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()),
        poll_interval=0.02,
        redis_retry_seconds=0.3,
    )
    runtime = WorkerRuntime(settings, "ways-out-worker")
    runtime._engine = engine
    yield runtime
    runtime._engine = None  # the module's engine outlives this runtime
    runtime.close()


@pytest.fixture
def store(redis_url):
    store = JobStore(redis_url)
    yield store
    store.close()


def test_a_bug_in_the_task_before_the_engine_ends_the_job_failed_naming_it(runtime, store, engine, monkeypatch):
    def broken(params, tenant, uploads):
        raise KeyError("a field the task did not expect")

    monkeypatch.setattr(job_steps, "with_input_images", broken)
    record, _ = store.create(tenant="tests", params=small_params())
    forwards = engine.stats()["forwards"]

    assert run_job(runtime) == "failed"

    ended = store.get(record.job_id)
    assert (ended.state, ended.error_code) == (JobState.FAILED, "worker_error")
    assert "KeyError" in ended.error_message and "a field the task did not expect" in ended.error_message
    assert not runtime.held.holds(record.job_id)
    assert engine.stats()["forwards"] == forwards  # it never reached the engine


def test_an_output_that_cannot_be_encoded_ends_the_job_failed_and_stores_nothing(runtime, store, tmp_path, monkeypatch):
    def broken(result):
        raise ValueError("no encoder for this output")

    monkeypatch.setattr(job_steps, "encode_outputs", broken)
    record, _ = store.create(tenant="tests", params=small_params())

    assert run_job(runtime) == "failed"

    ended = store.get(record.job_id)
    assert (ended.state, ended.error_code) == (JobState.FAILED, "upload_failed")
    assert "no encoder for this output" in ended.error_message
    assert ended.image_keys == [] and not list(tmp_path.rglob("*.png"))
    assert not runtime.held.holds(record.job_id)


def test_a_job_whose_end_cannot_be_written_is_left_running_to_its_lease_not_failed(runtime, store, monkeypatch):
    record, _ = store.create(tenant="tests", params=small_params())

    def redis_gone(*args, **kwargs):
        raise StorageUnavailableError("Redis is unreachable")

    monkeypatch.setattr(runtime.job_store, "finish", redis_gone)

    assert run_job(runtime) == "left to its lease"

    now = store.get(record.job_id)
    assert now.state is JobState.RUNNING and now.worker_id == runtime.worker_id  # a lease sweeper re-queues it
    assert not runtime.held.holds(record.job_id)  # no longer renewed: its lease lapses
