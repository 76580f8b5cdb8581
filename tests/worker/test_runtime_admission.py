"""The worker's shared state is never held across the engine's submit: one job's slow LoRA download or
image decode does not hold up another task thread, a release or a lost lease; a drain that comes while
the engine is still taking a job stops that job once the engine has it."""

from __future__ import annotations

import threading

import pytest

from batching import DiffusionEngine, EngineConfig
from core.errors import JobCanceledError, JobFailedError
from storage.settings import StorageSettings
from tests.support.engines import make_params
from tests.support.loras import make_lora
from worker.active_job import StopReason
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings

BOUND_SECONDS = 30  # far longer than a submit takes; the slow fetch waits until the test lets it go


class SlowLoraStore:
    """A LoRA fetcher that blocks until released, then returns `content` (None: no such adapter, the job fails
    naming it)."""

    def __init__(self) -> None:
        self.is_fetching = threading.Event()
        self.may_return = threading.Event()
        self.content: bytes | None = None

    def fetch(self, key: str) -> bytes | None:
        self.is_fetching.set()
        self.may_return.wait(BOUND_SECONDS * 2)
        return self.content


@pytest.fixture
def store() -> SlowLoraStore:
    return SlowLoraStore()


@pytest.fixture
def runtime(redis_url, tmp_path, store):
    settings = WorkerSettings(storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()))
    runtime = WorkerRuntime(settings, "admission-worker")
    config = EngineConfig(model="builtin:tiny", max_num_seqs=2, device="cpu", lora_url="s3://loras")
    runtime._engine = DiffusionEngine(config, lora_fetcher=store.fetch)
    yield runtime
    store.may_return.set()
    runtime.close()


def in_thread(call, *args):
    """Run `call` on a thread of its own; (thread, list that receives its result)."""
    results: list = []
    thread = threading.Thread(target=lambda: results.append(call(*args)), daemon=True)
    thread.start()
    return thread, results


def start_slow_submit(runtime: WorkerRuntime, store: SlowLoraStore):
    thread, results = in_thread(runtime.submit, "slow-lora", make_params(lora="big-adapter", num_inference_steps=2))
    assert store.is_fetching.wait(BOUND_SECONDS), "the slow submit reached its LoRA fetch"
    return thread, results


@pytest.mark.timeout(120)
def test_a_submit_stuck_in_a_lora_fetch_does_not_delay_another_submit_a_release_or_a_lost_lease(runtime, store):
    slow, slow_result = start_slow_submit(runtime, store)

    quick, quick_result = in_thread(runtime.submit, "quick", make_params(num_inference_steps=200))
    quick.join(BOUND_SECONDS)
    assert not quick.is_alive() and quick_result[0] is not None, "another task thread's submit went through"
    released, _ = in_thread(runtime.release_active, "some-ended-job")
    released.join(BOUND_SECONDS)
    assert not released.is_alive(), "release_active went through"
    lost, _ = in_thread(runtime._on_lease_lost, "quick")
    lost.join(BOUND_SECONDS)
    assert not lost.is_alive(), "the lease keeper's lease-lost path went through"
    with pytest.raises(JobCanceledError):
        quick_result[0].future.result(BOUND_SECONDS)
    assert slow.is_alive() and not store.may_return.is_set(), "all of it while the fetch was still under way"

    store.may_return.set()
    slow.join(BOUND_SECONDS)
    with pytest.raises(JobFailedError, match="big-adapter"):
        slow_result[0].future.result(BOUND_SECONDS)


@pytest.mark.timeout(120)
def test_a_drain_while_the_engine_takes_a_job_stops_that_job_once_the_engine_has_it(runtime, store, tmp_path):
    store.content = make_lora("builtin:tiny", tmp_path / "big-adapter.safetensors").read_bytes()
    slow, slow_result = start_slow_submit(runtime, store)

    requeued = runtime.stop_admission()

    assert requeued == ["slow-lora"], "the job being handed over is held, and goes back to the queue"
    store.may_return.set()
    slow.join(BOUND_SECONDS)
    active = slow_result[0]
    assert active.stop_reason is StopReason.REQUEUE
    with pytest.raises(JobCanceledError):  # not left waiting in the paused engine
        active.future.result(BOUND_SECONDS)
    assert runtime.submit("after-drain", make_params()) is None
