"""One life per job (issue 33): however a job ends, it ends once, with its state, it is counted in stats(),
and no denoiser forward carries it after the end.

Engine level, on builtin:tiny. A wrapper around the runner's group forward records the samples of each
forward and can hold the loop inside one, so a cancel, an abort or an injected engine error lands at a
known point: every forward that started after the loop was let go is checked for the ended job.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from batching import DiffusionEngine, EngineConfig, EngineShutdownError, JobCanceledError, JobFailedError
from tests.support.engines import DEADLINE_SECONDS, make_params


@pytest.fixture(scope="module")
def engine():
    """One engine for the tests that leave it serving (each reads its counts as a difference); tests that stop
    it or its threads build their own (`fresh_engine`)."""
    engine = DiffusionEngine(EngineConfig(device="cpu", max_num_seqs=4, encode_overlap=True, decode_overlap=True))
    yield engine
    engine.shutdown(abort=True)


@pytest.fixture(scope="module")
def inline_engine():
    """Encoding and decoding on the loop thread."""
    engine = DiffusionEngine(EngineConfig(device="cpu", max_num_seqs=4, encode_overlap=False, decode_overlap=False))
    yield engine
    engine.shutdown(abort=True)


@pytest.fixture(params=["beside-the-loop", "inline"])
def either_engine(request, engine, inline_engine):
    return engine if request.param == "beside-the-loop" else inline_engine


class Forwards:
    """Records the sample ids of every group forward the engine's runner starts, and can hold the loop just before
    the next one (`holding()`: the loop waits there until the block exits)."""

    def __init__(self, engine, monkeypatch) -> None:
        self.runs: list[set[str]] = []
        self.mark = 0  # forwards started when the loop was last let go
        self._hold = threading.Event()
        self._held = threading.Event()
        self._release = threading.Event()
        real_run_group = engine.model_runner._run_group

        def run_group(key, samples, output):
            self.runs.append({sample.sample_id for sample in samples})
            if self._hold.is_set():
                self._hold.clear()
                self._held.set()
                assert self._release.wait(DEADLINE_SECONDS)
            return real_run_group(key, samples, output)

        monkeypatch.setattr(engine.model_runner, "_run_group", run_group)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        self._held.clear()
        self._release.clear()
        self._hold.set()
        assert self._held.wait(DEADLINE_SECONDS), "the loop reached no forward"
        try:
            yield
        finally:
            self.mark = len(self.runs)
            self._release.set()

    def since_release(self, job_id: str) -> list[set[str]]:
        """Forwards started after the loop was let go that carried a sample of `job_id`."""
        return [run for run in self.runs[self.mark :] if any(_job_of(sample_id) == job_id for sample_id in run)]

    def ever(self, job_id: str) -> bool:
        return any(_job_of(sample_id) == job_id for run in self.runs for sample_id in run)


def _job_of(sample_id: str) -> str:
    return sample_id.split("#")[0]


def wait_for_waiting(engine, count: int) -> bool:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while engine.stats()["num_waiting"] < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return engine.stats()["num_waiting"] >= count


def wait_for_decodes(engine) -> None:
    """Until the decode worker has handed back what it held (a canceled job's image is dropped then)."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while engine.model_runner.decoder.pending and time.monotonic() < deadline:
        time.sleep(0.01)


def ends_once(future) -> list:
    """The calls its done callbacks get (one, once it has ended)."""
    calls: list = []
    future.add_done_callback(calls.append)
    return calls


def ended_counts(engine, before: dict[str, int] | None = None) -> dict[str, int]:
    """Images of the jobs that ended so (since `before`, another call's result)."""
    stats = engine.stats()
    counts = {name: stats[f"jobs_{name}"] for name in ("finished", "failed", "canceled", "aborted")}
    return {name: count - (before or {}).get(name, 0) for name, count in counts.items()}


def test_jobs_canceled_while_in_the_inbox_are_never_scheduled_and_are_counted_canceled(engine, monkeypatch):
    forwards = Forwards(engine, monkeypatch)
    before, steps_before = ended_counts(engine), engine.stats()["job_steps"]
    running = engine.submit(make_params(num_inference_steps=6), job_id="running")
    with forwards.holding():  # the loop is inside a forward: what is submitted now waits in the inbox
        canceled = [engine.submit(make_params(seed=i, num_images=2), job_id=f"gone-{i}") for i in range(3)]
        calls = [ends_once(future) for future in canceled]
        assert all(engine.cancel(future) for future in canceled)
        assert not engine.cancel(canceled[0]), "a job ends once"

    assert running.result(timeout=DEADLINE_SECONDS).image is not None
    for future, done in zip(canceled, calls):
        with pytest.raises(JobCanceledError):
            future.result(timeout=DEADLINE_SECONDS)
        assert done == [future]
    assert not any(forwards.ever(f"gone-{i}") for i in range(3))
    assert ended_counts(engine, before) == {"finished": 1, "failed": 0, "canceled": 6, "aborted": 0}  # images
    assert engine.stats()["job_steps"] - steps_before == 6, "only the running job's steps ran"


def test_a_job_canceled_during_its_forward_reaches_no_later_forward_and_the_others_finish(engine, monkeypatch):
    forwards = Forwards(engine, monkeypatch)
    before = ended_counts(engine)
    other = engine.submit(make_params(seed=1, num_inference_steps=8), job_id="other")
    target = engine.submit(make_params(seed=2, num_inference_steps=8), job_id="target")
    done = ends_once(target)
    while not forwards.ever("target"):
        with forwards.holding():
            pass
    with forwards.holding():
        assert engine.cancel("target")

    with pytest.raises(JobCanceledError):
        target.result(timeout=DEADLINE_SECONDS)
    assert other.result(timeout=DEADLINE_SECONDS).image is not None
    assert forwards.since_release("target") == []
    assert done == [target]
    assert ended_counts(engine, before) == {"finished": 1, "failed": 0, "canceled": 1, "aborted": 0}


def test_jobs_a_drain_cancels_after_pausing_admission_reach_no_forward(engine, monkeypatch):
    """What a worker's stop_admission does: pause the engine, cancel the jobs it has not started."""
    forwards = Forwards(engine, monkeypatch)
    before = ended_counts(engine)
    running = engine.submit(make_params(num_inference_steps=6), job_id="running")
    with forwards.holding():
        waiting = [engine.submit(make_params(seed=i), job_id=f"waiting-{i}") for i in range(3)]
        engine.pause()  # before the loop takes them: they wait in the scheduler, admission paused
    assert wait_for_waiting(engine, 3)
    calls = [ends_once(future) for future in waiting]
    for future in waiting:
        assert engine.cancel(future)

    assert running.result(timeout=DEADLINE_SECONDS).image is not None
    for future, done in zip(waiting, calls):
        with pytest.raises(JobCanceledError):
            future.result(timeout=DEADLINE_SECONDS)
        assert done == [future]
    assert not any(forwards.ever(f"waiting-{i}") for i in range(3))
    assert ended_counts(engine, before)["canceled"] == 3
    engine.resume()
    assert engine.submit(make_params(seed=9)).result(timeout=DEADLINE_SECONDS).image is not None


def test_an_engine_error_fails_the_scheduled_jobs_once_and_a_job_in_the_inbox_runs_after_it(engine, monkeypatch):
    forwards = Forwards(engine, monkeypatch)
    before = ended_counts(engine)
    real_execute = engine.model_runner.execute
    after_error: list = []

    def execute_failing_once(plan, aborted_since=tuple):
        if not after_error and forwards.ever("doomed"):
            after_error.append(engine.submit(make_params(seed=3), job_id="in-the-inbox"))
            raise RuntimeError("injected engine bug")
        return real_execute(plan, aborted_since)

    monkeypatch.setattr(engine.model_runner, "execute", execute_failing_once)
    doomed = engine.submit(make_params(seed=1, num_inference_steps=20), job_id="doomed")
    done = ends_once(doomed)

    with pytest.raises(JobFailedError, match="engine error: RuntimeError: injected engine bug"):
        doomed.result(timeout=DEADLINE_SECONDS)
    assert after_error[0].result(timeout=DEADLINE_SECONDS).image is not None
    mark = next(index for index, run in enumerate(forwards.runs) if "in-the-inbox" in run)
    assert not any("doomed" in run for run in forwards.runs[mark:]), "no forward after the error carried it"
    assert done == [doomed]
    assert ended_counts(engine, before) == {"finished": 1, "failed": 1, "canceled": 0, "aborted": 0}


def test_a_shutdown_with_abort_ends_running_and_inbox_jobs_once_before_another_forward(fresh_engine, monkeypatch):
    engine = fresh_engine(max_num_seqs=4)
    forwards = Forwards(engine, monkeypatch)
    running = engine.submit(make_params(num_inference_steps=20), job_id="running")
    with forwards.holding():
        queued = engine.submit(make_params(seed=2), job_id="queued")
        calls = [ends_once(running), ends_once(queued)]
        engine.shutdown(wait=False, abort=True)
    closer = threading.Thread(target=engine.shutdown)
    closer.start()
    closer.join(DEADLINE_SECONDS)

    assert not closer.is_alive(), "shutdown() returned"
    for future, done in zip((running, queued), calls):
        with pytest.raises(EngineShutdownError):
            future.result(timeout=0)
        assert done == [future]
    assert forwards.since_release("running") == [] and not forwards.ever("queued")
    assert ended_counts(engine) == {"finished": 0, "failed": 0, "canceled": 0, "aborted": 2}


def test_a_job_canceled_while_its_image_decodes_ends_canceled_once(engine, monkeypatch):
    adapter = engine.model_runner.model
    real_decode = adapter.decode
    decoding, release = threading.Event(), threading.Event()
    before = ended_counts(engine)

    def held_decode(latents, params_list):
        decoding.set()
        release.wait(DEADLINE_SECONDS)
        return real_decode(latents, params_list)

    monkeypatch.setattr(adapter, "decode", held_decode)
    future = engine.submit(make_params(num_inference_steps=2), job_id="decoding")
    done = ends_once(future)
    assert decoding.wait(DEADLINE_SECONDS)
    assert engine.cancel("decoding")
    release.set()

    with pytest.raises(JobCanceledError):
        future.result(timeout=DEADLINE_SECONDS)
    wait_for_decodes(engine)
    assert done == [future]
    assert ended_counts(engine, before) == {"finished": 0, "failed": 0, "canceled": 1, "aborted": 0}


# -- the encoder's and the decoder's threads ------------------------------------------------------


def test_an_error_while_starting_a_batch_fails_its_samples_with_it_and_the_next_job_runs(either_engine, monkeypatch):
    engine = either_engine
    import batching.encoder

    real = batching.encoder.encode_init_images
    calls = []

    def encode_init_images_failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected outside any sample")
        return real(*args, **kwargs)

    monkeypatch.setattr(batching.encoder, "encode_init_images", encode_init_images_failing_once)
    with pytest.raises(JobFailedError, match="could not start the job: RuntimeError: injected outside any sample"):
        engine.submit(make_params(seed=1, num_images=2)).result(timeout=DEADLINE_SECONDS)

    assert engine.submit(make_params(seed=2)).result(timeout=DEADLINE_SECONDS).image is not None
    assert engine.stats()["threads_failed"] == {}


def test_a_prompt_whose_texts_cannot_be_listed_fails_only_its_own_job(engine, monkeypatch):
    adapter = engine.model_runner.model
    real = adapter.texts_to_encode

    def texts_to_encode(params):
        if params.prompt == "poison":
            raise ValueError("cannot list this prompt's texts")
        return real(params)

    monkeypatch.setattr(adapter, "texts_to_encode", texts_to_encode)
    engine.pause()  # both start in one batch
    poisoned = engine.submit(make_params(prompt="poison", seed=1))
    good = engine.submit(make_params(prompt="a good prompt", seed=2))
    engine.resume()

    with pytest.raises(JobFailedError, match="prompt encoding failed: ValueError: cannot list"):
        poisoned.result(timeout=DEADLINE_SECONDS)
    assert good.result(timeout=DEADLINE_SECONDS).image is not None


def test_an_error_while_keeping_unmasked_pixels_fails_that_image_and_the_next_job_runs(either_engine, monkeypatch):
    engine = either_engine
    before = ended_counts(engine)
    import batching.decoder

    real = batching.decoder.keep_unmasked_pixels

    def keep_failing_for_seed_1(images, image):
        if image is not None and failing:
            failing.pop()
            raise OSError("injected composite failure")
        return real(images, image)

    failing = [True]
    monkeypatch.setattr(batching.decoder, "keep_unmasked_pixels", keep_failing_for_seed_1)
    with pytest.raises(JobFailedError, match="keeping the unmasked pixels failed: OSError: injected"):
        engine.submit(make_params(seed=1)).result(timeout=DEADLINE_SECONDS)

    assert engine.submit(make_params(seed=2)).result(timeout=DEADLINE_SECONDS).image is not None
    assert ended_counts(engine, before) == {"finished": 1, "failed": 1, "canceled": 0, "aborted": 0}


@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_a_worker_thread_that_stops_fails_what_it_held_reports_it_and_the_engine_goes_on_inline(
    fresh_engine, monkeypatch, part
):
    engine = fresh_engine(encode_overlap=True, decode_overlap=True)
    worker = getattr(engine.model_runner, part)
    real_run = worker._run

    def run_that_breaks_the_thread(batch):
        monkeypatch.setattr(worker, "_run", real_run)
        raise SystemError("the thread's own loop broke")  # past the batch's own catch-all: the thread ends

    monkeypatch.setattr(worker, "_run", run_that_breaks_the_thread)
    with pytest.raises(JobFailedError, match=f"the {worker.thread_name} thread stopped: SystemError"):
        engine.submit(make_params(seed=1)).result(timeout=DEADLINE_SECONDS)

    assert engine.submit(make_params(seed=2)).result(timeout=DEADLINE_SECONDS).image is not None
    stats = engine.stats()
    assert stats["threads_failed"] == {worker.thread_name: "SystemError: the thread's own loop broke"}
    assert stats[f"{'encode' if part == 'encoder' else 'decode'}_overlap"] is False, "its work now runs inline"
    closer = threading.Thread(target=engine.shutdown)
    closer.start()
    closer.join(DEADLINE_SECONDS)
    assert not closer.is_alive(), "shutdown() returned"
