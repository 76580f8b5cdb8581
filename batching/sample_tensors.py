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
    # Host copies of the sampler's schedule, made when the sample starts: the loop reads a step's timestep and
    # sigmas from them, never from the device (on CUDA a read of a device value waits for the device).
    host_timesteps: torch.Tensor | None = None  # [num_inference_steps] on the CPU; None: read the sampler's
    host_sigmas: torch.Tensor | None = None  # [num_inference_steps + 1] on the CPU, of samplers with sigmas

    @property
    def sample_id(self) -> str:
        return self.sample.sample_id

    @property
    def num_steps_done(self) -> int:
        """Its sample's steps, which the runner advances after each sampler step (the one count of them)."""
        return self.sample.num_steps_done

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
    def host_timestep(self) -> torch.Tensor:
        """This step's timestep as a 0-dim host tensor (what the sampler's step and the guidance read)."""
        if self.host_timesteps is None:
            return self.timestep
        return self.host_timesteps[self.sample.first_step + self.num_steps_done]

    @property
    def may_skip_step(self) -> bool:
        """Whether this step may reuse the step cache: the first step and the cache's final steps always compute."""
        num_final_steps = self.step_cache.num_final_steps if self.step_cache is not None else 1
        return 0 < self.num_steps_done < self.sample.num_steps - num_final_steps

    @property
    def is_finished(self) -> bool:
        return self.num_steps_done == self.sample.num_steps
