"""A worker whose engine thread died says so: `engine_stats`, its heartbeat, `GET /v1/models` and `/readyz`."""

from __future__ import annotations

import pytest

from api import create_app
from api.settings import ApiSettings
from batching import DiffusionEngine, EngineConfig
from core.errors import BatchingError
from storage.settings import StorageSettings
from tests.support.app_context import get_task_queue_of
from tests.support.calls import auth
from tests.support.engines import make_params
from tests.support.processes import TENANT_KEYS
from tests.support.waiting import wait_for
from worker.heartbeat import current_heartbeat
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings


@pytest.fixture
def runtime(redis_url, tmp_path):
    settings = WorkerSettings(storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()))
    runtime = WorkerRuntime(settings, "broken-engine-worker")
    runtime._engine = DiffusionEngine(EngineConfig(model="builtin:tiny", max_num_seqs=2, device="cpu"))
    yield runtime
    runtime.close()


@pytest.fixture
def api_client(redis_url, tmp_path):
    settings = ApiSettings(
        api_keys=tuple(TENANT_KEYS.items()),
        storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()),
    )
    app = create_app({"TESTING": True, "API_SETTINGS": settings})
    yield app.test_client()
    get_task_queue_of(app).close()


def test_a_worker_whose_engine_loop_died_reports_it_and_its_model_shows_unavailable(runtime, api_client, monkeypatch):
    engine = runtime.engine
    runtime.job_store.beat(current_heartbeat(runtime))
    assert api_client.get("/v1/models", headers=auth()).json["models"][0]["available"] is True

    def broken(*args) -> bool:
        raise SystemError("the loop broke")

    monkeypatch.setattr(engine, "step", broken)
    monkeypatch.setattr(engine, "_recover", broken)  # an error its recovery cannot get past: the loop ends
    with pytest.raises(BatchingError):
        engine.submit(make_params(num_inference_steps=2)).result(60)
    wait_for(lambda: not runtime.is_engine_running, 30, "the engine to report its loop stopped")

    assert runtime.stats()["threads_failed"] == {"stepwise-engine": "SystemError: the loop broke"}
    heartbeat = current_heartbeat(runtime)
    assert heartbeat.engine["threads_failed"] == {"stepwise-engine": "SystemError: the loop broke"}
    assert heartbeat.is_admitting is False
    runtime.job_store.beat(heartbeat)
    (model,) = api_client.get("/v1/models", headers=auth()).json["models"]
    assert model["available"] is False
    warnings = api_client.get("/readyz").json["warnings"]
    assert any("engine thread stepwise-engine stopped (SystemError: the loop broke)" in w for w in warnings), warnings
