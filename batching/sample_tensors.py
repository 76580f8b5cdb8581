"""A running sample's tensor state, owned by the model runner from admission until it leaves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from batching.params import GenerationParams
from batching.pipelines.contract import Conditioning

if TYPE_CHECKING:
    from batching.image_start import InpaintGuide


@dataclass(slots=True)
class SampleTensors:
    sample_id: str
    params: GenerationParams
    sampler: Any  # this sample's own diffusers scheduler: samplers keep state between steps
    generator: torch.Generator  # seeded by params.seed; draws the initial noise and any sampler noise
    latents: torch.Tensor  # [1, *latent_shape], in the family's layout (FLUX: packed tokens)
    row_conditioning: list[Conditioning]  # one per row the sample contributes to each forward
    num_steps_done: int = 0  # steps this sample ran (not counting the ones its strength skipped)
    first_step: int = 0  # index into sampler.timesteps of its first step: > 0 for image-to-image
    guide: InpaintGuide | None = None  # an inpainting sample's (latent blend)

    @property
    def num_rows(self) -> int:
        return len(self.row_conditioning)

    @property
    def timestep(self) -> torch.Tensor:
        return self.sampler.timesteps[self.first_step + self.num_steps_done]

    @property
    def is_finished(self) -> bool:
        return self.first_step + self.num_steps_done == len(self.sampler.timesteps)
