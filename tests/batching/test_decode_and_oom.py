"""Decode beside the denoise loop, and out-of-memory errors answered by splitting (issue 15).

Both are injected into a real engine on the built-in tiny model: a decoder that holds
its decode until the loop has taken more steps, and a denoiser (or decoder) that raises
torch.OutOfMemoryError above a row count, as a GPU would.
"""

from __future__ import annotations

import threading

import pytest
import torch

from batching import JobCanceledError, JobFailedError
from tests.support.engines import (
    DEADLINE_SECONDS,
    make_params,
    max_pixel_diff,
    pixels,
    run_alone,
    steps_taken_meanwhile,
)


def test_running_jobs_keep_stepping_while_another_job_decodes_and_images_are_unchanged(fresh_engine, solo_engine):
    engine = fresh_engine(decode_overlap=True)
    adapter = engine.model_runner.model
    real_decode = adapter.decode
    steps_of_long_job: list[int] = []
    steps_during_decode: list[int] = []

    def slow_decode(latents, params_list):
        """Holds the decode until the long job has stepped 3 more times (a loop waiting for it never would)."""
        if any(params.prompt == "short" for params in params_list):
            steps_during_decode.append(steps_taken_meanwhile(steps_of_long_job, 3))
        return real_decode(latents, params_list)

    adapter.decode = slow_decode
    short = make_params(prompt="short", seed=3, num_inference_steps=3)
    long = make_params(prompt="long", seed=4, num_inference_steps=12)
    long_future = engine.submit(long, on_progress=lambda done, total: steps_of_long_job.append(done))
    short_future = engine.submit(short)

    short_image = short_future.result(timeout=120).image
    long_image = long_future.result(timeout=120).image

    assert steps_during_decode and steps_during_decode[0] >= 3
    assert engine.stats()["jobs_finished"] == 2 and engine.stats()["decode_overlap"] is True
    short_alone, long_alone = run_alone(solo_engine, [short, long])
    assert max_pixel_diff(short_image, short_alone) <= 1
    assert max_pixel_diff(long_image, long_alone) <= 1


def test_a_job_whose_image_is_decoded_beside_the_loop_resolves_during_the_loops_next_forward(fresh_engine):
    engine = fresh_engine(decode_overlap=True, max_num_seqs=2)
    adapter = engine.model_runner.model
    real_forward = adapter.forward
    is_short_done, release = threading.Event(), threading.Event()

    def forward(batch):
        if is_short_done.is_set():  # the long job's forwards after the short one's last step wait here
            release.wait(DEADLINE_SECONDS)
        return real_forward(batch)

    adapter.forward = forward
    engine.pause()
    long = engine.submit(make_params(prompt="long", seed=1, num_inference_steps=8))
    short = engine.submit(
        make_params(prompt="short", seed=2, num_inference_steps=2),
        on_progress=lambda done, total: done == total and is_short_done.set(),
    )
    engine.resume()
    try:
        image = short.result(timeout=DEADLINE_SECONDS).image  # with the long job's forward still held
        was_held = not release.is_set()
    finally:
        release.set()

    assert image.size == (64, 64) and was_held
    assert long.result(timeout=120).image.size == (64, 64)
    assert engine.stats()["jobs_finished"] == 2


def test_a_job_canceled_while_its_image_decodes_is_canceled_and_not_counted_finished(fresh_engine):
    engine = fresh_engine(decode_overlap=True)
    adapter = engine.model_runner.model
    real_decode = adapter.decode
    decoding, release = threading.Event(), threading.Event()

    def held_decode(latents, params_list):
        decoding.set()
        release.wait(DEADLINE_SECONDS)
        return real_decode(latents, params_list)

    adapter.decode = held_decode
    future = engine.submit(make_params(num_inference_steps=2), job_id="late-cancel")
    assert decoding.wait(DEADLINE_SECONDS)

    assert engine.cancel("late-cancel")
    release.set()

    with pytest.raises(JobCanceledError):
        future.result(timeout=120)
    engine.shutdown()
    assert engine.stats()["jobs_finished"] == 0


def _forward_out_of_memory_above(adapter, max_rows: int) -> list[int]:
    """Make the adapter's forward raise OutOfMemoryError above `max_rows` rows; returns the rows tried."""
    real_forward = adapter.forward
    tried: list[int] = []

    def forward(batch):
        num_rows = len(batch.latents) if isinstance(batch.latents, list) else batch.latents.shape[0]
        tried.append(num_rows)
        if num_rows > max_rows:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected above {max_rows} rows)")
        return real_forward(batch)

    adapter.forward = forward
    return tried


def test_a_group_that_runs_out_of_memory_is_split_and_every_sample_gets_its_image_alone(fresh_engine, solo_engine):
    engine = fresh_engine(max_num_seqs=4)
    tried = _forward_out_of_memory_above(engine.model_runner.model, max_rows=4)  # 2 guided samples
    params = make_params(prompt="a split group", seed=20, num_images=4, num_inference_steps=5)

    result = engine.submit(params).result(timeout=120)

    assert max(tried) == 8  # the 4 samples (8 rows) were tried together once
    stats = engine.stats()
    assert stats["oom_splits"] >= 1 and stats["jobs_failed"] == 0
    assert max(stats["rows_per_forward"]) == 4  # every forward that ran fitted
    assert tried.count(8) == 1  # the cap held: no second attempt at 8 rows
    alone = run_alone(
        solo_engine, [make_params(prompt="a split group", seed=seed, num_inference_steps=5) for seed in result.seeds]
    )
    for image, single in zip(result.images, alone):
        assert max_pixel_diff(image, single) <= 1


def test_a_sample_that_does_not_fit_alone_fails_saying_so_and_others_finish(fresh_engine):
    engine = fresh_engine(max_num_seqs=4)
    _forward_out_of_memory_above(engine.model_runner.model, max_rows=1)  # a guided sample needs 2 rows
    too_big = engine.submit(make_params(prompt="guided", guidance_scale=7.5))
    fits = engine.submit(make_params(prompt="unguided", guidance_scale=1.0))

    assert fits.result(timeout=120).image.size == (64, 64)
    with pytest.raises(JobFailedError, match="out of memory: .* does not fit on the device even alone"):
        too_big.result(timeout=120)


def test_a_decode_batch_that_runs_out_of_memory_is_split(fresh_engine, solo_engine):
    engine = fresh_engine(max_num_seqs=4)
    adapter = engine.model_runner.model
    real_decode = adapter.decode
    decoded_sizes: list[int] = []

    def decode(latents, params_list):
        decoded_sizes.append(latents.shape[0])
        if latents.shape[0] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (injected above 1 image)")
        return real_decode(latents, params_list)

    adapter.decode = decode
    params = make_params(prompt="two at once", seed=30, num_images=2, num_inference_steps=3)

    result = engine.submit(params).result(timeout=120)

    assert decoded_sizes == [2, 1, 1]
    assert engine.stats()["oom_splits"] == 1
    alone = run_alone(
        solo_engine, [make_params(prompt="two at once", seed=seed, num_inference_steps=3) for seed in result.seeds]
    )
    for image, single in zip(result.images, alone):
        assert max_pixel_diff(image, single) <= 1


def test_a_sample_whose_image_comes_out_nan_fails_saying_so_and_its_decode_batch_mates_finish(fresh_engine):
    """Before, NaN pixels were cast to bytes and the job succeeded with a black picture. Its latents stay
    finite; the VAE overflows on its row only (its last layer's output scaled past float32's range, as a VAE
    in half precision can), so only a check of the decoded image itself catches it."""
    engine = fresh_engine(max_num_seqs=4)
    adapter = engine.model_runner.model
    real_decode = adapter.decode
    decode_batch_sizes: list[int] = []
    overflowing_rows: list[int] = []

    def decode(latents, params_list):
        assert torch.isfinite(latents).all(), "the latents a decode gets are finite"
        decode_batch_sizes.append(len(params_list))
        overflowing_rows[:] = [row for row, params in enumerate(params_list) if params.prompt == "overflow"]
        return real_decode(latents, params_list)

    def overflow(module, inputs, output):  # the VAE's last convolution: [n, 3, H, W]
        output[overflowing_rows] *= 1e39
        return output

    adapter.decode = decode
    hook = adapter.vae.decoder.conv_out.register_forward_hook(overflow)
    try:
        engine.pause()
        doomed = engine.submit(make_params(prompt="overflow", seed=1, num_inference_steps=3))
        healthy = engine.submit(make_params(prompt="a calm lake", seed=2, num_inference_steps=3))
        engine.resume()

        with pytest.raises(JobFailedError, match="NaN or infinite"):
            doomed.result(timeout=120)
        image = healthy.result(timeout=120).image
    finally:
        hook.remove()
    assert 2 in decode_batch_sizes  # decoded together: the failure stayed with its own sample
    assert pixels(image).std() > 0  # a picture, not one flat colour
    adapter.decode = real_decode
    assert engine.submit(make_params(prompt="overflow", num_inference_steps=2)).result(timeout=120).image
