"""The engine as a user drives it: submit, results, progress, cancel, failures, stats, shutdown."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from batching import (
    EngineShutdownError,
    GenerationResult,
    InvalidParamsError,
    JobCanceledError,
    JobFailedError,
)
from core.families import FAMILIES
from tests.support.engines import make_params, max_pixel_diff, pixels, run_alone


def test_a_job_at_default_size_returns_an_image_with_its_timings(batched_engine):
    params = make_params(height=128, width=128, num_inference_steps=20)

    result = batched_engine.submit(params, job_id="fox-1").result(timeout=120)

    assert isinstance(result, GenerationResult)
    assert result.job_id == "fox-1"
    assert result.image.size == (128, 128) and result.image.mode == "RGB"
    assert result.seeds == [params.seed] and result.params == params
    assert set(result.timings) == {"queue_wait", "denoise", "decode"}
    assert all(seconds > 0 for seconds in result.timings.values())


def test_a_jobs_timings_say_where_its_time_went(solo_engine):
    engine = solo_engine  # one job at a time
    engine.pause()
    try:
        started = time.perf_counter()
        # 24 steps against 2: wide enough that a busy machine's stall in the short job cannot reverse them
        first = engine.submit(make_params(prompt="first", seed=1, num_inference_steps=24))
        second = engine.submit(make_params(prompt="second", seed=2, num_inference_steps=2))
    finally:
        engine.resume()

    first_timings = first.result(timeout=120).timings
    second_timings = second.result(timeout=120).timings
    wall = time.perf_counter() - started

    assert second_timings["queue_wait"] >= first_timings["denoise"], "the second waited while the first ran"
    assert second_timings["queue_wait"] > first_timings["queue_wait"]
    assert first_timings["denoise"] > second_timings["denoise"] > 0, "24 steps take longer than 2"
    assert sum(second_timings.values()) <= wall, "its parts fit in the time from submit to its result"


def test_eight_jobs_submitted_together_share_forwards(fresh_engine):
    engine = fresh_engine(max_num_seqs=8)
    futures = [engine.submit(make_params(prompt=f"fox {i}", seed=i)) for i in range(8)]

    for future in futures:
        future.result(timeout=120)

    stats = engine.stats()
    assert stats["jobs_finished"] == 8
    assert max(stats["jobs_per_forward"]) > 1
    assert max(stats["rows_per_forward"]) > 2
    assert stats["forwards"] < 8 * 8
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0


def test_num_images_gives_distinct_images_with_consecutive_seeds(batched_engine, solo_engine):
    params = make_params(seed=40, num_images=3)

    result = batched_engine.submit(params).result(timeout=120)

    assert result.seeds == [40, 41, 42]
    assert len({pixels(image).tobytes() for image in result.images}) == 3
    singles = run_alone(solo_engine, [make_params(seed=seed) for seed in result.seeds])
    for image, single in zip(result.images, singles):
        assert max_pixel_diff(image, single) <= 1


def test_progress_is_reported_once_per_step_and_a_raising_callback_is_ignored(batched_engine):
    reported = []

    def on_progress(num_steps_done, num_steps_total):
        reported.append((num_steps_done, num_steps_total))
        raise RuntimeError("callback bug")

    batched_engine.submit(make_params(num_inference_steps=5), on_progress=on_progress).result(timeout=120)

    assert reported == [(step, 5) for step in range(1, 6)]


def test_canceling_a_running_job_raises_job_canceled_and_others_finish(batched_engine):
    has_started = threading.Event()
    long_job = batched_engine.submit(
        make_params(num_inference_steps=200), on_progress=lambda done, total: has_started.set()
    )
    other = batched_engine.submit(make_params(seed=99, num_inference_steps=10))
    assert has_started.wait(timeout=60)
    canceled_before = batched_engine.stats()["jobs_canceled"]

    assert batched_engine.cancel(long_job)

    with pytest.raises(JobCanceledError):
        long_job.result(timeout=60)
    assert other.result(timeout=120).image is not None
    assert batched_engine.stats()["jobs_canceled"] == canceled_before + 1
    assert not batched_engine.cancel(long_job)


def test_a_job_can_be_canceled_by_its_id_while_waiting(fresh_engine):
    engine = fresh_engine(max_num_seqs=1)
    engine.pause()
    future = engine.submit(make_params(), job_id="queued-job")

    assert engine.cancel("queued-job")

    with pytest.raises(JobCanceledError):
        future.result(timeout=60)
    assert not engine.cancel("no-such-job")


def test_a_failing_group_fails_its_jobs_readably_and_the_engine_serves_the_next(fresh_engine, monkeypatch):
    engine = fresh_engine()
    model = engine.model_runner.model
    real_forward = model.forward
    calls = []

    def broken_forward(batch):
        calls.append(batch.latents.shape[0])
        if len(calls) == 3:
            raise RuntimeError("injected denoiser failure")
        return real_forward(batch)

    monkeypatch.setattr(model, "forward", broken_forward)
    engine.pause()
    doomed = [engine.submit(make_params(seed=i)) for i in range(2)]
    engine.resume()

    for future in doomed:
        with pytest.raises(JobFailedError, match="denoiser forward failed.*injected denoiser failure"):
            future.result(timeout=60)
    assert engine.submit(make_params(seed=5)).result(timeout=120).image is not None
    assert engine.stats()["jobs_failed"] == 2


@pytest.mark.parametrize("field", ["prompt", "negative_prompt"])
def test_a_prompt_with_a_lone_surrogate_is_refused_at_submit_naming_it_not_failed_by_the_tokenizer(
    batched_engine, field
):
    text = "a red \udcff fox"  # what Python makes of a non-UTF-8 byte on a command line (surrogateescape)
    with pytest.raises(InvalidParamsError) as error:
        make_params(**{field: text})
    assert error.value.field == field and "surrogate" in str(error.value)

    forged = make_params(num_inference_steps=2)
    object.__setattr__(forged, field, text)  # altered after validation: the engine checks again
    with pytest.raises(InvalidParamsError) as error:
        batched_engine.submit(forged)
    assert error.value.field == field


def test_a_request_for_another_model_is_rejected_naming_the_model_field(batched_engine):
    with pytest.raises(InvalidParamsError) as error:
        batched_engine.submit(make_params(model="builtin:small"))

    assert error.value.field == "model"


def test_pause_holds_waiting_jobs_until_resume(fresh_engine):
    engine = fresh_engine()
    engine.pause()
    future = engine.submit(make_params(num_inference_steps=3))

    with pytest.raises(TimeoutError):
        future.result(timeout=1.0)
    assert engine.stats()["num_waiting"] == 1

    engine.resume()
    assert future.result(timeout=120).image is not None


def test_shutdown_drains_accepted_jobs_by_default(fresh_engine):
    engine = fresh_engine()
    futures = [engine.submit(make_params(seed=i, num_inference_steps=4)) for i in range(3)]

    engine.shutdown()

    assert all(future.result(timeout=0).image is not None for future in futures)
    with pytest.raises(EngineShutdownError):
        engine.submit(make_params())


def test_shutdown_with_abort_fails_unfinished_jobs(fresh_engine):
    engine = fresh_engine(max_num_seqs=1)
    has_started = threading.Event()
    running = engine.submit(make_params(num_inference_steps=200), on_progress=lambda done, total: has_started.set())
    waiting = engine.submit(make_params(seed=3))
    assert has_started.wait(timeout=60)

    engine.shutdown(abort=True)

    for future in (running, waiting):
        with pytest.raises(EngineShutdownError):
            future.result(timeout=0)


def test_importing_batching_does_not_import_torch_or_service_packages():
    code = (
        "import sys, batching, batching.scheduler, batching.plan\n"
        "from batching import EngineConfig, GenerationParams, GenerationResult\n"
        "loaded = [m for m in ('torch', 'diffusers', 'flask', 'celery', 'redis', 'boto3') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_lora_request_to_an_engine_without_a_lora_store_is_refused_naming_the_field(batched_engine):
    assert batched_engine.config.lora_url is None
    with pytest.raises(InvalidParamsError, match="needs a LoRA store") as error:
        batched_engine.submit(make_params(lora="some-adapter"))

    assert error.value.field == "lora"


def test_jobs_submitted_from_many_threads_at_once_all_finish(batched_engine):
    futures = []
    lock = threading.Lock()

    def submit(seed):
        future = batched_engine.submit(make_params(seed=seed, num_inference_steps=4))
        with lock:
            futures.append(future)

    threads = [threading.Thread(target=submit, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(future.result(timeout=120).seeds[0] for future in futures) == list(range(6))


def test_an_invalid_engine_config_is_refused_before_loading_a_model():
    from batching import EngineConfig

    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=0)


def test_a_cancel_takes_effect_before_the_next_group_forward_of_the_same_iteration(fresh_engine, monkeypatch):
    engine = fresh_engine(max_num_seqs=4, max_num_groups=2)
    model = engine.model_runner.model
    real_forward = model.forward
    steps_of = {"small": [], "large": []}
    steps_at_cancel = []

    def forward_that_cancels_the_other_group(batch):
        if batch.latents.shape[-1] == 8 and len(steps_of["small"]) == 3 and not steps_at_cancel:
            steps_at_cancel.append(len(steps_of["large"]))
            assert engine.cancel("large")  # called from inside the small group's forward
        return real_forward(batch)

    monkeypatch.setattr(model, "forward", forward_that_cancels_the_other_group)
    engine.pause()
    small = engine.submit(
        make_params(height=64, width=64, num_inference_steps=8),
        job_id="small",
        on_progress=lambda done, total: steps_of["small"].append(done),
    )
    large = engine.submit(
        make_params(height=96, width=96, num_inference_steps=8),
        job_id="large",
        on_progress=lambda done, total: steps_of["large"].append(done),
    )
    engine.resume()

    with pytest.raises(JobCanceledError):
        large.result(timeout=60)
    assert small.result(timeout=60).image is not None
    assert steps_at_cancel == [3]
    assert len(steps_of["large"]) == 3, "the canceled job's group ran no forward after the cancel"


def test_after_a_failed_step_the_engine_still_admits_within_its_token_budget(fresh_engine, monkeypatch):
    engine = fresh_engine(max_num_seqs=2)  # no max_num_tokens: the family's default budget (2 default samples)
    budget = engine.stats()["max_num_tokens"]
    assert budget == FAMILIES["sd"].default_token_budget(2)
    real_execute = engine.model_runner.execute
    calls = []

    def execute_failing_once(plan, aborted_since=tuple):
        calls.append(plan)
        if len(calls) == 1:
            raise RuntimeError("injected engine bug")
        return real_execute(plan, aborted_since)

    monkeypatch.setattr(engine.model_runner, "execute", execute_failing_once)
    with pytest.raises(JobFailedError, match="engine error: RuntimeError: injected engine bug"):
        engine.submit(make_params(seed=1)).result(timeout=60)

    assert engine.stats()["max_num_tokens"] == budget
    # Each of these costs more than half the budget (2 rows x 24x24 latents): they run one after the other.
    assert 2 * FAMILIES["sd"].sample_cost(192, 192, 7.5) > budget
    engine.pause()
    futures = [engine.submit(make_params(seed=i, height=192, width=192, num_inference_steps=2)) for i in range(2)]
    engine.resume()
    for future in futures:
        future.result(timeout=120)
    assert set(engine.stats()["jobs_per_forward"]) == {1}, "no forward held both: the budget admits one"
