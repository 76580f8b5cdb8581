"""What the flow-matching transformer families share (FLUX.1, FLUX.2, SD3, Z-Image, Qwen-Image; Wan, with its own
samplers), done as their diffusers pipelines do it:

- the sampler: a `FlowMatchEulerDiscreteScheduler` per sample from the model's config, its sigmas from 1 to
  1/steps as the pipelines pass them (`sigmas`; None lets the scheduler place them, as SD3's pipeline does),
  shifted by `mu` (`shift_mu`: FLUX's `calculate_shift` of the image's token count; a scheduler without
  dynamic shifting ignores it); as `FlowMatchSampler`, which also gives live previews its estimate of the
  final latents;
- a sample's initial latents: standard normal noise of the pipeline's shape (`noise_shape`) drawn from the
  sample's own generator as `randn_tensor` draws it, laid out as the denoiser takes it (`pack_latents`:
  `token_patch` x `token_patch` patches as tokens, [1, tokens, c * p * p]; None keeps them as drawn, [1, c, h, w]
  or a video's [1, c, frames, h, w]);
- the transformer's input is the latents as they are (`model_input`), and its guidance is the base's
  (`AdapterBase.row_conditioning`, `guided_prediction`);
- decode: the latents unpacked (`unpack_latents`) through the VAE (`batching.pipelines.vae`).

A family's adapter holds what is its own: how it encodes prompts, its noise shape, what its transformer takes
(`forward`) and what each row carries (`row_extras`), and where its pipeline departs from the above.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, cast

import numpy as np
import torch
from diffusers.schedulers.scheduling_flow_match_euler_discrete import FlowMatchEulerDiscreteScheduler
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from batching.pipelines.adapter_base import AdapterBase
from batching.pipelines.contract import RunningSample, Sampler
from core.params import GenerationParams


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


class FlowSampler(Sampler, Protocol):
    """`FlowMatchEulerDiscreteScheduler`, as the families' image-to-image pipelines use it."""

    def scale_noise(self, sample: torch.Tensor, timestep: torch.Tensor, noise: torch.Tensor) -> torch.Tensor: ...


class FlowMatchingAdapter(AdapterBase):
    token_patch: ClassVar[int | None] = None  # latents packed into p x p patches as tokens (FLUX.1, Qwen-Image: 2;
    # FLUX.2: 1, its latents being patchified already); None: they stay [1, c, h, w] (SD3, Z-Image)
    default_max_shift: ClassVar[float] = 1.15  # calculate_shift's `max_shift` when the config names none

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.transformer = pipeline.transformer

    def noise_shape(self, params: GenerationParams) -> tuple[int, ...]:
        """The shape of a sample's noise as the family's pipeline draws it; its last two axes are the grid the
        latents are packed from."""
        raise NotImplementedError

    def latent_grid(self, params: GenerationParams, patch: int = 2) -> tuple[int, int]:
        """(height, width) of the VAE's latents for the job's size, rounded down to whole `patch` x `patch`
        patches as the pipelines round them."""
        unit = self.vae_scale_factor * patch
        return patch * (params.height // unit), patch * (params.width // unit)

    def token_grid(self, params: GenerationParams) -> tuple[int, int]:
        """Rows and columns of the image's 2x2 patches of latents (the packed families' tokens)."""
        height, width = self.latent_grid(params)
        return height // 2, width // 2

    def num_image_tokens(self, params: GenerationParams) -> int:
        """The image's 2x2 patches of latents: the token count the sampler's shift follows."""
        height, width = self.token_grid(params)
        return height * width

    def sigmas(self, params: GenerationParams) -> np.ndarray | None:
        if self.pipeline.scheduler.config.get("use_flow_sigmas"):
            return None
        return np.linspace(1.0, 1 / params.num_inference_steps, params.num_inference_steps)

    def shift_mu(self, params: GenerationParams) -> float:
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        config = self.pipeline.scheduler.config
        return calculate_shift(
            self.num_image_tokens(params),
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", self.default_max_shift),
        )

    def new_sampler(self, params: GenerationParams) -> Sampler:
        sampler = FlowMatchSampler.from_config(self.pipeline.scheduler.config)
        sigmas = self.sigmas(params)
        sampler.set_timesteps(params.num_inference_steps, self.device, sigmas=sigmas, mu=self.shift_mu(params))
        sampler.set_begin_index(0)
        return cast(Sampler, sampler)

    def draw_noise(self, params: GenerationParams, generator: torch.Generator) -> torch.Tensor:
        shape = self.noise_shape(params)
        noise = randn_tensor(shape, generator=generator, device=self.device, dtype=self.latent_dtype)
        if self.token_patch is None:
            return noise  # [1, c, h, w], or a video's [1, c, frames, h, w]
        return self.pack_latents(noise.view(1, -1, *shape[-2:]))  # a video VAE's one frame joins the channels

    def initial_latents(self, params: GenerationParams, sampler: Sampler, generator: torch.Generator) -> torch.Tensor:
        return self.draw_noise(params, generator)

    def noised_latents(
        self, sampler: Sampler, image_latents: torch.Tensor, noise: torch.Tensor, timestep: torch.Tensor
    ) -> torch.Tensor:
        return cast(FlowSampler, sampler).scale_noise(image_latents, timestep.reshape(1), noise)

    def pack_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """[1, c, h, w] to p x p patches [1, (h/p)*(w/p), c*p*p], as the pipelines pack them."""
        patch = self.token_patch
        if patch is None:
            return latents
        _, channels, height, width = latents.shape
        packed = latents.view(1, channels, height // patch, patch, width // patch, patch).permute(0, 2, 4, 1, 3, 5)
        return packed.reshape(1, (height // patch) * (width // patch), channels * patch * patch)

    def unpack_latents(self, latents: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        """Latents [n, *latent_shape] of samples of `params`' size back to the grid they were packed from,
        [n, c, h, w]."""
        patch = self.token_patch
        if patch is None:
            return latents
        height, width = self.noise_shape(params)[-2:]
        num, channels = latents.shape[0], latents.shape[2] // (patch * patch)
        grid = latents.view(num, height // patch, width // patch, channels, patch, patch).permute(0, 3, 1, 4, 2, 5)
        return grid.reshape(num, channels, height, width)

    def model_input(self, sample: RunningSample) -> torch.Tensor:
        return sample.latents

    def decode(self, latents: torch.Tensor, params_list: Sequence[GenerationParams]) -> list[Image.Image | None]:
        return self.latent_vae.decode(self.unpack_latents(latents, params_list[0]))

    def preview_latents(self, latents: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        return self.unpack_latents(latents, params)[0]  # [c, h, w]
