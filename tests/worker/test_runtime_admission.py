"""The worker's shared state is never held across the engine's submit: one job's slow LoRA download or
image decode does not hold up another job's thread, a let-go or a lost lease; a drain that comes while
the engine is still taking a job stops that job once the engine has it."""

from __future__ import annotations

import threading

import pytest

from batching import DiffusionEngine, EngineConfig
from benchmarks.random_loras import make_lora
from core.errors import JobCanceledError, JobFailedError
from storage.settings import StorageSettings
from tests.support.engines import make_params
from tests.support.held_jobs import hold
from worker.held_job import StopReason
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
    held = hold(runtime, "slow-lora")
    thread, results = in_thread(runtime.submit, held, make_params(lora="big-adapter", num_inference_steps=2))
    assert store.is_fetching.wait(BOUND_SECONDS), "the slow submit reached its LoRA fetch"
    return thread, held


@pytest.mark.timeout(120)
def test_a_submit_stuck_in_a_lora_fetch_does_not_delay_another_submit_a_release_or_a_lost_lease(runtime, store):
    slow, slow_held = start_slow_submit(runtime, store)

    quick_held = hold(runtime, "quick")
    quick, quick_result = in_thread(runtime.submit, quick_held, make_params(num_inference_steps=200))
    quick.join(BOUND_SECONDS)
    assert not quick.is_alive() and quick_result == [True], "another job thread's submit went through"
    ended = hold(runtime, "some-ended-job")
    let_go, _ = in_thread(runtime.held.let_go, ended)
    let_go.join(BOUND_SECONDS)
    assert not let_go.is_alive(), "a let-go went through"
    lost, _ = in_thread(runtime._on_lease_lost, "quick", quick_held.holder)
    lost.join(BOUND_SECONDS)
    assert not lost.is_alive(), "the lease keeper's lease-lost path went through"
    with pytest.raises(JobCanceledError):
        quick_held.future.result(BOUND_SECONDS)
    assert slow.is_alive() and not store.may_return.is_set(), "all of it while the fetch was still under way"

    store.may_return.set()
    slow.join(BOUND_SECONDS)
    with pytest.raises(JobFailedError, match="big-adapter"):
        slow_held.future.result(BOUND_SECONDS)


@pytest.mark.timeout(120)
def test_a_drain_while_the_engine_takes_a_job_stops_that_job_once_the_engine_has_it(runtime, store, tmp_path):
    store.content = make_lora("builtin:tiny", tmp_path / "big-adapter.safetensors").read_bytes()
    slow, held = start_slow_submit(runtime, store)

    requeued = runtime.stop_admission()

    assert requeued == ["slow-lora"], "the job being handed over is held, and goes back to the queue"
    store.may_return.set()
    slow.join(BOUND_SECONDS)
    assert held.stop_reason is StopReason.REQUEUE
    with pytest.raises(JobCanceledError):  # not left waiting in the paused engine
        held.future.result(BOUND_SECONDS)
    after = hold(runtime, "after-drain")
    assert runtime.submit(after, make_params()) is False and after.future is None
