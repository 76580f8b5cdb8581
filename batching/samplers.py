"""Sampler names (ComfyUI's) mapped to diffusers scheduler classes.

A sampler keeps state between steps (Euler a step index, DPM++ a history of model
outputs), so every job gets its own instance, built from the model's scheduler config.
"""

from __future__ import annotations

from typing import Any

from diffusers.schedulers.scheduling_ddim import DDIMScheduler
from diffusers.schedulers.scheduling_dpmsolver_multistep import DPMSolverMultistepScheduler
from diffusers.schedulers.scheduling_euler_ancestral_discrete import EulerAncestralDiscreteScheduler
from diffusers.schedulers.scheduling_euler_discrete import EulerDiscreteScheduler
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from core.families import UNET_SAMPLERS

SAMPLER_CLASSES: dict[str, tuple[type[SchedulerMixin], dict[str, Any]]] = {
    "ddim": (DDIMScheduler, {}),
    "euler": (EulerDiscreteScheduler, {}),
    "euler_ancestral": (EulerAncestralDiscreteScheduler, {}),
    "dpmpp_2m": (DPMSolverMultistepScheduler, {"algorithm_type": "dpmsolver++", "solver_order": 2}),
}
assert set(SAMPLER_CLASSES) == set(UNET_SAMPLERS)


def make_sampler(name: str, model_scheduler_config: Any, num_inference_steps: int, device: Any) -> SchedulerMixin:
    """A fresh sampler for one job, with its timesteps set.

    A sampler that counts its steps (all but DDIM) finds its first index at its first call by searching its
    timesteps for the one it is given (`index_for_timestep`: `nonzero()` and `item()`), which on CUDA waits
    for the device: the loop would stall at every new job's first step. It is found here instead, where the
    sample is started (beside the loop when encoding overlaps it), with the same search: the same index,
    and image-to-image samples set theirs again as diffusers' img2img pipelines do (batching.image_start)."""
    sampler_class, overrides = SAMPLER_CLASSES[name]
    sampler = sampler_class.from_config(model_scheduler_config, **overrides)
    assert not isinstance(sampler, tuple)  # a (sampler, unused kwargs) pair only with return_unused_kwargs
    sampler.set_timesteps(num_inference_steps, device=device)
    assert len(sampler.timesteps) == num_inference_steps, f"{name} takes one model call per step"
    if hasattr(sampler, "set_begin_index") and hasattr(sampler, "index_for_timestep"):
        sampler.set_begin_index(sampler.index_for_timestep(sampler.timesteps[0]))
    return sampler
