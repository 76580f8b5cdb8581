"""A running job's tensor state, owned by the model runner from admission until it leaves."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from batching.params import GenerationParams


@dataclass(slots=True)
class SampleTensors:
    job_id: str
    params: GenerationParams
    sampler: SchedulerMixin  # this job's own instance: samplers keep state between steps
    generator: torch.Generator  # seeded by params.seed; draws the initial noise and any sampler noise
    latents: torch.Tensor  # [1, c, h/8, w/8]
    cond_embeds: torch.Tensor  # [seq, dim]
    uncond_embeds: torch.Tensor | None  # [seq, dim]; None when the job has no guidance
    num_steps_done: int = 0

    @property
    def num_rows(self) -> int:
        return self.params.num_rows

    @property
    def has_guidance(self) -> bool:
        return self.params.has_guidance

    @property
    def timestep(self) -> torch.Tensor:
        return self.sampler.timesteps[self.num_steps_done]

    @property
    def is_finished(self) -> bool:
        return self.num_steps_done == len(self.sampler.timesteps)
