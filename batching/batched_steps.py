"""Guidance and sampler steps for a forward's samples together, a few kernels for all of them.

One sample's classifier-free guidance is three small kernels and an Euler step about eight, each with
its own scalars: sixteen samples launched some 180 kernels a step (on CUDA several microseconds of the
loop's host time each, before it can queue the next forward). Here the samples that share a kind share
the kernels, their own scalars (guidance scale, sigmas) going along as per-row vectors copied to the
device in one transfer:

- guidance: adapters that combine rows with the base's CFG (`AdapterBase.guided_prediction` and
  `guidance_scale` not overridden); the two-row samples together, one-row samples step on their row;
- steps: Euler (`EulerDiscreteScheduler` without churn, epsilon or v-prediction) and flow-matching Euler
  (`FlowMatchSampler`, not stochastic), the samples of one sampler class, latent shape and dtype together.

Anything else goes one sample at a time, as diffusers steps it. The vectors follow how torch rounds
diffusers' scalar arithmetic in half precision (a 0-dim operand cast to the other's dtype or kept in
float32, by device and position; on CUDA a division by a host scalar taken as a product with its
reciprocal): on the CPU a batched step gives exactly the bits of diffusers' own `step`, in float32 and
bfloat16 (tests/batching/test_batched_steps.py); on CUDA the same rules are torch's kernels as read, not
measured here, so there a result may differ from diffusers' in the last bit. Whatever the device, a
sample of a kind that steps together always does, alone or in any company: its result never depends on
what it runs with, and deterministic mode stays bit-identical.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from diffusers.schedulers.scheduling_euler_discrete import EulerDiscreteScheduler

from batching.host_copy import to_device
from batching.pipelines.adapter_base import AdapterBase
from batching.pipelines.contract import PipelineAdapter
from batching.pipelines.flow_matching import FlowMatchSampler
from batching.sample_tensors import SampleTensors

Stepped = tuple[torch.Tensor, torch.Tensor]  # (next latents [1, ...], estimate of the final latents [1, ...])


def guided_predictions(
    adapter: PipelineAdapter, predictions: torch.Tensor | list[torch.Tensor], samples: Sequence[SampleTensors]
) -> list[torch.Tensor]:
    """Each sample's guided prediction [1, *latent_shape], in sample order, from the forward's rows."""
    rows = _rows_of(predictions, samples)
    if isinstance(predictions, list) or not isinstance(adapter, AdapterBase) or not _has_base_guidance(adapter):
        return [adapter.guided_prediction(r, s.params, s.host_timestep) for r, s in zip(rows, samples)]
    guided = list(rows)  # a one-row sample steps on its row, as the base's guidance returns it
    pairs = [index for index, sample in enumerate(samples) if sample.num_rows == 2]
    if not pairs:
        return guided
    if len(pairs) == len(samples):  # every sample's rows, in order: the forward's own rows, no copy
        stacked = predictions[: 2 * len(pairs)]
    else:
        stacked = torch.cat([rows[index] for index in pairs])
    stacked = stacked.view(len(pairs), 2, *stacked.shape[1:])  # [num_pairs, 2, *latent_shape]
    uncond, cond = (stacked[:, 0], stacked[:, 1]) if adapter.uncond_first else (stacked[:, 1], stacked[:, 0])
    scales = [adapter.guidance_scale(samples[index].params, samples[index].host_timestep) for index in pairs]
    scale = to_device(scales, stacked.device, stacked.dim() - 2)
    combined = uncond + (scale * (cond - uncond)).to(stacked.dtype)  # the scalar's product, rounded as torch does
    for position, index in enumerate(pairs):
        guided[index] = combined[position : position + 1]
    return guided


def batch_kind(sample: SampleTensors, prediction: torch.Tensor) -> tuple | None:
    """What samples must share to step together (sampler kind, latent shape, dtypes); None: step alone."""
    sampler = sample.sampler
    if type(sampler) is EulerDiscreteScheduler:
        config = sampler.config
        if config.prediction_type not in ("epsilon", "v_prediction") or sampler.step_index is None:
            return None
        kind = "euler"
    elif type(sampler) is FlowMatchSampler:
        if sampler.config.stochastic_sampling or sampler.step_index is None or sample.host_sigmas is None:
            return None
        kind = "flow_euler"
    else:
        return None
    latents = sample.latents
    return (kind, sampler.config.get("prediction_type"), tuple(latents.shape), latents.dtype, prediction.dtype)


def step_together(samples: Sequence[SampleTensors], predictions: Sequence[torch.Tensor]) -> list[Stepped]:
    """One step of samples of one `batch_kind`: each one's (next latents, estimate), as its sampler's `step`
    returns them; their step indices advance. Raises without changing any sampler if a kernel fails."""
    kind = batch_kind(samples[0], predictions[0])
    assert kind is not None
    model_output = torch.cat(list(predictions))  # [n, *latent_shape]
    sample = torch.cat([s.latents for s in samples]).to(torch.float32)
    extra = sample.dim() - 1
    if kind[0] == "euler":
        next_latents, estimate = _euler(samples, model_output, sample, extra, kind[1])
    else:
        next_latents, estimate = _flow_euler(samples, model_output, sample, extra)
    for s in samples:
        s.sampler._step_index += 1
    return [(next_latents[i : i + 1], estimate[i : i + 1]) for i in range(len(samples))]


def _euler(
    samples: Sequence[SampleTensors], model_output: torch.Tensor, sample: torch.Tensor, extra: int, prediction: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """`EulerDiscreteScheduler.step` with s_churn 0 (gamma 0: sigma_hat is sigma)."""
    sigmas = [s.sampler.sigmas[s.sampler.step_index] for s in samples]  # host float32 0-dim tensors
    next_sigmas = [s.sampler.sigmas[s.sampler.step_index + 1] for s in samples]
    dtype = model_output.dtype
    if prediction == "epsilon":  # diffusers: sample - sigma_hat * model_output, sigma_hat a 0-dim host tensor
        sigma = to_device(sigmas, sample.device, extra)
        if sample.device.type == "cuda":  # a host scalar operand keeps its float32 value
            estimate = sample - (sigma * model_output).to(dtype)
        else:  # the CPU casts a first-operand 0-dim tensor to the other's dtype
            estimate = sample - sigma.to(dtype) * model_output
    else:  # v_prediction: model_output * (-sigma / (sigma**2 + 1) ** 0.5) + sample / (sigma**2 + 1)
        scale = to_device([-s / (s**2 + 1) ** 0.5 for s in sigmas], sample.device, extra)
        estimate = (scale * model_output).to(dtype) + _divide(sample, [s**2 + 1 for s in sigmas], extra)
    derivative = _divide(sample - estimate, sigmas, extra)
    dt = to_device([n - s for n, s in zip(next_sigmas, sigmas)], sample.device, extra)
    return (sample + derivative * dt).to(dtype), estimate


def _flow_euler(
    samples: Sequence[SampleTensors], model_output: torch.Tensor, sample: torch.Tensor, extra: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`FlowMatchSampler.step` (flow-matching Euler, and its estimate `latents - sigma * velocity`)."""
    host_sigmas = [s.host_sigmas for s in samples]
    assert all(sigmas is not None for sigmas in host_sigmas), "batch_kind steps only samples with host sigmas"
    sigmas = [h[s.sampler.step_index] for h, s in zip(host_sigmas, samples)]  # type: ignore[index]
    next_sigmas = [h[s.sampler.step_index + 1] for h, s in zip(host_sigmas, samples)]  # type: ignore[index]
    dtype = model_output.dtype
    sigma = to_device(sigmas, sample.device, extra)
    estimate = (sample - sigma * model_output.float()).to(dtype)
    # diffusers: sample + dt * model_output, dt a 0-dim tensor (on CUDA a device one) cast to the prediction's dtype
    dt = to_device([n - s for n, s in zip(next_sigmas, sigmas)], sample.device, extra).to(dtype)
    return (sample + dt * model_output).to(dtype), estimate


def _divide(values: torch.Tensor, divisors: list[torch.Tensor], extra: int) -> torch.Tensor:
    """`values / divisor` per row, rounded as torch divides by a host scalar: on CUDA a product with the
    reciprocal (computed in float32), on the CPU a true division."""
    if values.device.type == "cuda":
        return values * to_device([1.0 / divisor for divisor in divisors], values.device, extra)
    return values / to_device(divisors, values.device, extra)


def _rows_of(predictions: torch.Tensor | list[torch.Tensor], samples: Sequence[SampleTensors]) -> list[torch.Tensor]:
    """Each sample's rows [num_rows, *latent_shape] of the forward's output (padding rows left out)."""
    rows, row = [], 0
    for sample in samples:
        if isinstance(predictions, list):
            rows.append(torch.stack(predictions[row : row + sample.num_rows]))
        else:
            rows.append(predictions[row : row + sample.num_rows])
        row += sample.num_rows
    return rows


def _has_base_guidance(adapter: AdapterBase) -> bool:
    kind = type(adapter)
    return kind.guided_prediction is AdapterBase.guided_prediction and kind.guidance_scale is AdapterBase.guidance_scale
