"""Wan's samplers, set up as `WanPipeline` and `WanImageToVideoPipeline` set up the scheduler they are given.

The checkpoints ship flow-matching UniPC (`UniPCMultistepScheduler` with flow sigmas and a shift,
`flow_shift`: 3 for Wan 2.1 at 480p, 5 at 720p, 12 for Wan 2.2 T2V A14B); a job may ask for
flow-matching Euler (`FlowMatchEulerDiscreteScheduler`) with the same shift instead. Either is
built from the model's scheduler config and set up as the pipelines do it: `set_timesteps(steps)`
(no sigmas, no `mu`), beginning at index 0. UniPC keeps a history of model outputs between steps,
so every sample has its own instance.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from diffusers.schedulers.scheduling_flow_match_euler_discrete import FlowMatchEulerDiscreteScheduler
from diffusers.schedulers.scheduling_unipc_multistep import UniPCMultistepScheduler

from batching.pipelines.contract import Sampler

DEFAULT_FLOW_SHIFT = 3.0  # Wan 2.1's, for a scheduler config that names no shift


class FlowUniPC(UniPCMultistepScheduler):
    """UniPC as the runner steps every sampler: it passes the sample's generator, which UniPC (drawing no
    noise) has no use for."""

    def step(
        self,
        model_output: torch.Tensor,
        timestep: int | torch.Tensor,
        sample: torch.Tensor,
        return_dict: bool = True,
        generator: torch.Generator | None = None,
    ) -> Any:
        return super().step(model_output, timestep, sample, return_dict=return_dict)


def flow_shift(scheduler_config: Any) -> float:
    """The shift of a Wan scheduler config: UniPC's `flow_shift`, or a flow-matching Euler config's `shift`."""
    if scheduler_config.get("use_flow_sigmas") and scheduler_config.get("flow_shift") is not None:
        return float(scheduler_config["flow_shift"])
    return float(scheduler_config.get("shift") or DEFAULT_FLOW_SHIFT)


def new_sampler(name: str, scheduler_config: Any, num_steps: int, device: torch.device) -> Sampler:
    """A fresh sampler of `name` ("unipc" or "euler") for one sample, its timesteps set."""
    shift = flow_shift(scheduler_config)
    sampler: Any
    if name == "unipc":
        sampler = FlowUniPC.from_config(
            scheduler_config, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift
        )
    else:
        assert name == "euler", name
        sampler = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config, shift=shift)
    sampler.set_timesteps(num_steps, device=device)
    sampler.set_begin_index(0)
    return cast(Sampler, sampler)
