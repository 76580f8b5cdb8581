"""Guidance and sampler steps taken for many samples at once (`batching.batched_steps`) give each sample the
same bits as its own step: diffusers' `step` on one sample, and the adapter's own guidance."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers import EulerDiscreteScheduler

from batching.batched_steps import batch_kind, guided_predictions, step_together
from batching.pipelines.flow_matching import FlowMatchSampler
from batching.pipelines.stable_diffusion.adapter import StableDiffusionAdapter
from batching.sample import make_samples
from batching.sample_tensors import SampleTensors
from core.families import FAMILIES
from core.params import GenerationParams

SCHEDULE = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")


def euler(prediction_type: str) -> EulerDiscreteScheduler:
    sampler = EulerDiscreteScheduler(prediction_type=prediction_type, **SCHEDULE)
    sampler.set_timesteps(12)
    sampler.set_begin_index(0)
    return sampler


def flow() -> FlowMatchSampler:
    sampler = FlowMatchSampler(num_train_timesteps=1000, shift=3.0)
    sampler.set_timesteps(12)
    sampler.set_begin_index(0)
    return sampler


def running(sampler, index: int, step: int, dtype: torch.dtype, rows: int = 1) -> SampleTensors:
    params = GenerationParams(prompt="a fox", model="builtin:tiny", seed=index, guidance_scale=7.3 if rows == 2 else 1)
    sample = make_samples(f"s{index}", params, FAMILIES["sd"])[0]
    sampler._step_index = step  # midway: every sample at its own step
    return SampleTensors(
        sample=sample,
        sampler=sampler,
        generator=torch.Generator().manual_seed(index),
        latents=torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(index)).to(dtype),
        row_conditioning=[{}] * rows,
        host_timesteps=sampler.timesteps,
        host_sigmas=sampler.sigmas,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("make", [lambda: euler("epsilon"), lambda: euler("v_prediction"), flow])
def test_samples_stepped_together_equal_each_stepped_alone(make, dtype):
    samples = [running(make(), index, step, dtype) for index, step in enumerate((0, 3, 3, 7, 11))]
    predictions = [torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(50 + i)).to(dtype) for i in range(5)]
    alone = []
    for sample, prediction in zip(samples, predictions):
        own = copy.deepcopy(sample.sampler)
        timestep = own.timesteps[own.step_index]
        alone.append(own.step(prediction, timestep, sample.latents, return_dict=False))
    assert len({batch_kind(sample, prediction) for sample, prediction in zip(samples, predictions)}) == 1

    together = step_together(samples, predictions)

    for (next_alone, estimate_alone, *_), (next_together, estimate_together) in zip(alone, together):
        assert next_together.dtype == next_alone.dtype and torch.equal(next_together, next_alone)
        assert torch.equal(estimate_together, estimate_alone)
    assert [sample.sampler.step_index for sample in samples] == [1, 4, 4, 8, 12]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_guidance_for_many_samples_equals_each_samples_own(dtype):
    adapter = object.__new__(StableDiffusionAdapter)  # the base's CFG needs no model
    samples = [running(euler("epsilon"), i, 2, dtype, rows) for i, rows in enumerate((2, 1, 2, 2))]
    predictions = torch.randn(7, 4, 8, 8, generator=torch.Generator().manual_seed(9)).to(dtype)
    for batch in (samples, [s for s in samples if s.num_rows == 2]):  # mixed rows (gathered), and pairs only
        num_rows = sum(s.num_rows for s in batch)
        rows = torch.split(predictions[:num_rows], [s.num_rows for s in batch])

        guided = guided_predictions(adapter, predictions[: num_rows + 1], batch)  # the last row: padding

        for sample, own_rows, result in zip(batch, rows, guided):
            expected = adapter.guided_prediction(own_rows, sample.params, sample.host_timestep)
            assert result.shape == (1, 4, 8, 8) and torch.equal(result, expected)
