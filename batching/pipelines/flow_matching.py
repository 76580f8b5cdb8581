"""The flow-matching Euler sampler as the transformer families' pipelines set it up."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from diffusers.schedulers.scheduling_flow_match_euler_discrete import FlowMatchEulerDiscreteScheduler


class FlowMatchSampler(FlowMatchEulerDiscreteScheduler):
    """diffusers' flow-matching Euler sampler that, as DDIM and Euler do, also returns its estimate of the final
    latents (`latents - sigma * velocity`) from a tuple step: what a live preview shows (batching.previews), a
    picture where the current latents are still mostly noise. The next latents are diffusers' own."""

    def step(self, model_output: Any, timestep: Any, sample: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("return_dict", True) or kwargs.get("per_token_timesteps") is not None:
            return super().step(model_output, timestep, sample, *args, **kwargs)
        if self.step_index is None:
            self._init_step_index(timestep)
        sigma = self.sigmas[self.step_index]
        estimate = (sample.float() - sigma * model_output.float()).to(model_output.dtype)
        return (*super().step(model_output, timestep, sample, *args, **kwargs), estimate)


def flow_matching_sampler(
    scheduler_config: Any, num_steps: int, num_image_tokens: int, device: torch.device, mu: float | None = None
) -> Any:
    """A fresh FlowMatchSampler for one sample: sigmas from 1 to 1/steps, and the shift `mu` for the
    image's token count (used when the config shifts dynamically, as FLUX's does; a family whose
    pipeline computes it otherwise passes its own)."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    config = scheduler_config
    sampler = FlowMatchSampler.from_config(config)
    sigmas = None if config.get("use_flow_sigmas") else np.linspace(1.0, 1 / num_steps, num_steps)
    if mu is None:
        mu = calculate_shift(
            num_image_tokens,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
    sampler.set_timesteps(sigmas=sigmas, mu=mu, device=device)
    sampler.set_begin_index(0)
    return sampler
