"""A running sample's tensor state, owned by the model runner from admission until it leaves.

The runner's side of a `batching.sample.Sample`: the sample itself (its id, params and step
count, as the scheduler sees it) with the tensors its steps need. Handed to the decoder
after its last step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from batching.pipelines.contract import Conditioning, StepCacheState
from batching.sample import Sample
from core.params import GenerationParams


@dataclass(slots=True)
class InpaintGuide:
    """A latent-blend inpainting sample's image, to re-noise outside its mask after every step
    (`batching.image_start`)."""

    image_latents: torch.Tensor  # [1, *latent_shape] in denoiser space
    noise: torch.Tensor  # the noise the sample started from
    mask: torch.Tensor  # latent layout, 1 = repaint


@dataclass(slots=True)
class SampleTensors:
    sample: Sample
    sampler: Any  # this sample's own diffusers scheduler: samplers keep state between steps
    generator: torch.Generator  # seeded by params.seed; draws the initial noise and any sampler noise
    latents: torch.Tensor  # [1, *latent_shape], in the family's layout (FLUX: packed tokens)
    row_conditioning: list[Conditioning]  # one per row the sample contributes to each forward
    guide: InpaintGuide | None = None  # an inpainting sample's (latent blend)
    step_cache: StepCacheState | None = None  # a sample that caches steps (core.step_cache): its own cache
    num_steps_done: int = 0  # steps its tensors took (the scheduler's count catches up in update_from_output)

    @property
    def sample_id(self) -> str:
        return self.sample.sample_id

    @property
    def params(self) -> GenerationParams:
        return self.sample.params

    @property
    def num_rows(self) -> int:
        return len(self.row_conditioning)

    @property
    def timestep(self) -> torch.Tensor:
        return self.sampler.timesteps[self.sample.first_step + self.num_steps_done]

    @property
    def may_skip_step(self) -> bool:
        """Whether this step may reuse the step cache: the first step and the cache's final steps always compute."""
        num_final_steps = self.step_cache.num_final_steps if self.step_cache is not None else 1
        return 0 < self.num_steps_done < self.sample.num_steps - num_final_steps

    @property
    def is_finished(self) -> bool:
        return self.num_steps_done == self.sample.num_steps
