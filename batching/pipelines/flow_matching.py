"""The flow-matching Euler sampler as the transformer families' pipelines set it up."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def flow_matching_sampler(
    scheduler_config: Any, num_steps: int, num_image_tokens: int, device: torch.device, mu: float | None = None
) -> Any:
    """A fresh FlowMatchEulerDiscreteScheduler for one sample: sigmas from 1 to 1/steps, and the
    shift `mu` for the image's token count (used when the config shifts dynamically, as FLUX's does;
    a family whose pipeline computes it otherwise passes its own)."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    config = scheduler_config
    sampler = FlowMatchEulerDiscreteScheduler.from_config(config)
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
