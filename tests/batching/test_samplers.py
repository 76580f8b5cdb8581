"""The UNet families' samplers (`batching.samplers`): one fresh sampler per job, stepping as diffusers' own."""

from __future__ import annotations

import pytest
import torch

from batching.builtin_models.folders import builtin_model_path
from batching.samplers import SAMPLER_CLASSES, make_sampler
from core.families import UNET_SAMPLERS


@pytest.mark.parametrize("name", UNET_SAMPLERS)
def test_a_sampler_steps_as_diffusers_own_without_searching_its_timesteps(name):
    """The first step's index is found when the sampler is made, so stepping never reads a device tensor back
    (on CUDA that search waits for the device at every new job's first step); the steps are diffusers' own."""
    from diffusers import DDIMScheduler

    config = DDIMScheduler.from_pretrained(builtin_model_path("builtin:tiny"), subfolder="scheduler").config
    ours = make_sampler(name, config, 6, "cpu")
    sampler_class, overrides = SAMPLER_CLASSES[name]
    theirs = sampler_class.from_config(config, **overrides)
    theirs.set_timesteps(6, device="cpu")

    def no_search(*args, **kwargs):
        raise AssertionError("the sampler searched its timesteps while stepping")

    if hasattr(ours, "index_for_timestep"):
        ours.index_for_timestep = no_search
    latents = {id(ours): torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))}
    latents[id(theirs)] = latents[id(ours)].clone()
    for step, timestep in enumerate(theirs.timesteps):
        prediction = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(step))
        for sampler in (ours, theirs):
            model_input = sampler.scale_model_input(latents[id(sampler)], timestep)
            assert model_input.shape == (1, 4, 8, 8)
            generator = torch.Generator().manual_seed(100 + step)  # euler_ancestral draws noise
            latents[id(sampler)] = sampler.step(prediction, timestep, latents[id(sampler)], generator=generator)[0]
    assert torch.equal(latents[id(ours)], latents[id(theirs)])
