"""Prompt encoding beside the denoise loop (issue 15): running jobs keep stepping while a new job starts.

Injected into a real engine on the built-in tiny model: a text encoder that holds the
encode of one prompt until the loop has taken more steps, one that refuses a prompt,
and one that waits for a cancel.
"""

from __future__ import annotations

import threading

import pytest

from batching import JobCanceledError, JobFailedError
from tests.support.engines import DEADLINE_SECONDS, make_params, max_pixel_diff, run_alone, steps_taken_meanwhile


def test_running_jobs_keep_stepping_while_a_new_jobs_prompt_encodes_and_images_are_unchanged(fresh_engine, solo_engine):
    engine = fresh_engine(encode_overlap=True)
    adapter = engine.model_runner.model
    real_encode = adapter.encode_prompts
    steps_of_running_job: list[int] = []
    steps_during_encode: list[int] = []

    def slow_encode(texts):
        """Holds the new prompt's encode until the running job has stepped 3 more times."""
        if "a new arrival" in texts:
            steps_during_encode.append(steps_taken_meanwhile(steps_of_running_job, 3))
        return real_encode(texts)

    adapter.encode_prompts = slow_encode
    running = make_params(prompt="a running job", seed=4, num_inference_steps=12)
    arrival = make_params(prompt="a new arrival", seed=5, num_inference_steps=4)
    futures = {}

    def on_progress(num_steps_done: int, num_steps_total: int) -> None:
        steps_of_running_job.append(num_steps_done)
        if num_steps_done == 1:  # the running job is in its forwards: now a new job arrives
            futures["arrival"] = engine.submit(arrival)

    running_image = engine.submit(running, on_progress=on_progress).result(timeout=120).image
    arrival_image = futures["arrival"].result(timeout=120).image

    assert steps_during_encode and steps_during_encode[0] >= 3
    stats = engine.stats()
    assert stats["encode_overlap"] is True and stats["jobs_finished"] == 2 and stats["encode_seconds"] > 0
    assert stats["job_steps"] == 12 + 4
    running_alone, arrival_alone = run_alone(solo_engine, [running, arrival])
    assert max_pixel_diff(running_image, running_alone) <= 1
    assert max_pixel_diff(arrival_image, arrival_alone) <= 1


@pytest.mark.parametrize("encode_overlap", [True, False], ids=["beside-the-loop", "inline"])
def test_a_prompt_the_text_encoder_refuses_fails_only_its_own_job(fresh_engine, encode_overlap):
    engine = fresh_engine(encode_overlap=encode_overlap)
    adapter = engine.model_runner.model
    real_encode = adapter.encode_prompts

    def refusing_encode(texts):
        if "a poisoned prompt" in texts:
            raise RuntimeError("the text encoder refused a prompt")
        return real_encode(texts)

    adapter.encode_prompts = refusing_encode
    engine.pause()  # all three are admitted in one iteration: their prompts go through one call first
    good = engine.submit(make_params(prompt="a good prompt", seed=1, num_inference_steps=3))
    poisoned = engine.submit(make_params(prompt="a poisoned prompt", seed=2, num_inference_steps=3))
    other = engine.submit(make_params(prompt="another good one", seed=3, num_inference_steps=3))
    engine.resume()

    with pytest.raises(JobFailedError, match="prompt encoding failed: RuntimeError: the text encoder refused"):
        poisoned.result(timeout=120)
    assert good.result(timeout=120).image.size == (64, 64)
    assert other.result(timeout=120).image.size == (64, 64)
    stats = engine.stats()
    assert stats["jobs_failed"] == 1 and stats["jobs_finished"] == 2


def test_a_job_canceled_while_its_prompt_encodes_is_canceled_and_running_jobs_finish(fresh_engine, solo_engine):
    engine = fresh_engine(encode_overlap=True)
    adapter = engine.model_runner.model
    real_encode = adapter.encode_prompts
    encoding, release = threading.Event(), threading.Event()

    def held_encode(texts):
        if "canceled while encoding" in texts:
            encoding.set()
            release.wait(DEADLINE_SECONDS)
        return real_encode(texts)

    adapter.encode_prompts = held_encode
    running = make_params(prompt="keeps running", seed=6, num_inference_steps=10)
    running_future = engine.submit(running)
    canceled_future = engine.submit(make_params(prompt="canceled while encoding", seed=7), job_id="early-cancel")
    assert encoding.wait(DEADLINE_SECONDS)

    assert engine.cancel("early-cancel")
    with pytest.raises(JobCanceledError):
        canceled_future.result(timeout=120)
    release.set()
    running_image = running_future.result(timeout=120).image

    engine.shutdown()
    stats = engine.stats()
    assert stats["jobs_finished"] == 1 and stats["jobs_canceled"] == 1 and stats["jobs_failed"] == 0
    assert max_pixel_diff(running_image, run_alone(solo_engine, [running])[0]) <= 1
