"""The Stable Diffusion family (SD 1.x/2.x UNets) behind the pipeline contract.

A sample with classifier-free guidance puts two rows into each forward, [uncond, cond],
and its own guidance scale combines them afterwards; a sample without it puts one row.
The UNet takes one timestep per row, so samples at different steps share a forward.
`StableDiffusionXLAdapter` extends this with SDXL's added conditioning. Step caching is
DeepCache over the UNet's deep path (`batching.pipelines.stable_diffusion.step_cache`).

An inpainting UNet (9 input channels, as in SD inpainting checkpoints) takes, beside the
latents, the mask at latent size and the latents of the masked image; as diffusers'
`StableDiffusionInpaintPipeline` does, they are concatenated to the scaled latents on the
channel axis. They travel as two more per-row conditioning tensors (`mask_conditioning`,
built at admission by `batching.image_start`), so samples with different masks and
images share a forward, and a CFG sample's two rows carry the same ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

import torch
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from batching.pipelines import published_latent_rgb as published
from batching.pipelines.adapter_base import AdapterBase, tokenize
from batching.pipelines.contract import CachedForward, CachedSample, Conditioning, ForwardBatch, RunningSample, Sampler
from batching.pipelines.stable_diffusion.step_cache import NUM_BLOCKS_KEPT, deep_cached_forward, num_unet_blocks
from batching.samplers import make_sampler
from core.errors import ModelLoadError
from core.params import GenerationParams


class UnetSampler(Sampler, Protocol):
    """The UNet families' samplers (`batching.samplers`) start from noise scaled by `init_noise_sigma`, scale the
    model's input and noise an image to a timestep."""

    init_noise_sigma: float

    def scale_model_input(self, sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor: ...

    def add_noise(
        self, original_samples: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor
    ) -> torch.Tensor: ...


class StableDiffusionAdapter(AdapterBase):
    family = "sd"
    pipeline_classes = ("StableDiffusionPipeline", "StableDiffusionInpaintPipeline")  # 4- or 9-channel UNet
    load_options = {"safety_checker": None, "feature_extractor": None, "requires_safety_checker": False}
    published_latent_rgb = published.SD1
    uncond_first = True

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.unet = pipeline.unet
        self.scheduler_config = pipeline.scheduler.config
        latent_channels = self.vae.config.latent_channels
        in_channels = self.unet.config.in_channels
        if in_channels not in (latent_channels, 2 * latent_channels + 1):
            raise ModelLoadError(
                f"model {model!r} has a UNet with {in_channels} input channels; this engine serves {latent_channels} "
                f"(text-to-image) or {2 * latent_channels + 1} (inpainting: latents, mask, masked-image latents)"
            )
        self.has_mask_channels = in_channels != latent_channels
        self.num_cache_blocks = num_unet_blocks(self.unet)  # DeepCache (stable_diffusion.step_cache)
        self.num_blocks_kept = NUM_BLOCKS_KEPT

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        tokenizer, text_encoder = self.pipeline.tokenizer, self.pipeline.text_encoder
        tokens = tokenize(tokenizer, texts)
        input_ids = tokens.input_ids.to(self.device)  # [n, seq]
        uses_mask = getattr(text_encoder.config, "use_attention_mask", False)
        attention_mask = tokens.attention_mask.to(self.device) if uses_mask else None
        embeds = text_encoder(input_ids, attention_mask=attention_mask)[0].to(self.dtype)  # [n, seq, dim]
        return [{"embeds": row} for row in embeds]

    def new_sampler(self, params: GenerationParams) -> Sampler:
        return cast(
            Sampler, make_sampler(params.sampler, self.scheduler_config, params.num_inference_steps, self.device)
        )

    def draw_noise(self, params: GenerationParams, generator: torch.Generator) -> torch.Tensor:
        shape = (
            1,
            self.vae.config.latent_channels,
            params.height // self.vae_scale_factor,
            params.width // self.vae_scale_factor,
        )
        return randn_tensor(shape, generator=generator, device=self.device, dtype=self.dtype)  # [1, c, h/8, w/8]

    def initial_latents(self, params: GenerationParams, sampler: Sampler, generator: torch.Generator) -> torch.Tensor:
        return self.draw_noise(params, generator) * cast(UnetSampler, sampler).init_noise_sigma

    def padding_row(self, params: GenerationParams) -> Conditioning:
        tokenizer, text_encoder = self.pipeline.tokenizer, self.pipeline.text_encoder
        return {
            "embeds": self.zeros(tokenizer.model_max_length, text_encoder.config.hidden_size),
            **self.mask_channels_padding(params),
        }

    def noised_latents(
        self, sampler: Sampler, image_latents: torch.Tensor, noise: torch.Tensor, timestep: torch.Tensor
    ) -> torch.Tensor:
        return cast(UnetSampler, sampler).add_noise(image_latents, noise, timestep.reshape(1))

    def mask_conditioning(self, mask: torch.Tensor, masked_image_latents: torch.Tensor) -> Conditioning:
        """An inpainting UNet's extra inputs for each of a sample's rows: its [1, 1, H, W] pixel mask (1 =
        repaint) downsampled to latent size (nearest, as diffusers does) and its masked image's latents."""
        small = torch.nn.functional.interpolate(mask, size=tuple(masked_image_latents.shape[-2:]))  # [1, 1, h, w]
        return {
            "mask": small[0].to(self.device, self.dtype),
            "masked_image_latents": masked_image_latents[0].to(self.device, self.dtype),  # [c, h, w]
        }

    def mask_channels_padding(self, params: GenerationParams) -> Conditioning:
        if not self.has_mask_channels:
            return {}
        latent_size = (params.height // self.vae_scale_factor, params.width // self.vae_scale_factor)
        return {
            "mask": self.zeros(1, *latent_size),
            "masked_image_latents": self.zeros(self.vae.config.latent_channels, *latent_size),
        }

    def model_input(self, sample: RunningSample) -> torch.Tensor:
        return cast(UnetSampler, sample.sampler).scale_model_input(sample.latents, sample.timestep)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        self._count_positions(batch)
        return self.unet(
            self._unet_input(batch),
            batch.timesteps,
            encoder_hidden_states=batch.conditioning["embeds"],
            added_cond_kwargs=self.added_cond_kwargs(batch),
            return_dict=False,
        )[0]

    @torch.inference_mode()
    def forward_cached(
        self, batch: ForwardBatch, samples: Sequence[CachedSample], *, may_gather: bool
    ) -> CachedForward:
        self._count_positions(batch)
        return deep_cached_forward(
            self.unet,
            self._unet_input(batch),
            batch.timesteps,
            batch.conditioning["embeds"],
            self.added_cond_kwargs(batch),
            samples,
            may_gather=may_gather,
        )

    def _count_positions(self, batch: ForwardBatch) -> None:
        """A UNet row's positions: its latent pixels (the sequence of its first attention blocks) and its text
        tokens. Rows of a group are one size (it is in the key), so none is padded but deterministic padding rows."""
        latents, embeds = batch.latents, batch.conditioning["embeds"]  # [rows, c, h, w], [rows, 77, dim]
        assert isinstance(latents, torch.Tensor)
        batch.count_positions([latents.shape[-2] * latents.shape[-1] + embeds.shape[1]] * latents.shape[0])

    def _unet_input(self, batch: ForwardBatch) -> torch.Tensor:
        latents = batch.latents  # [num_rows, 4, h, w]
        assert isinstance(latents, torch.Tensor)  # UNet families keep the size in the key: one shape per group
        if self.has_mask_channels:
            conditioning = batch.conditioning
            latents = torch.cat([latents, conditioning["mask"], conditioning["masked_image_latents"]], dim=1)
        return latents

    def added_cond_kwargs(self, batch: ForwardBatch) -> dict[str, torch.Tensor] | None:
        return None

    def decode(self, latents: torch.Tensor, params_list: Sequence[GenerationParams]) -> list[Image.Image | None]:
        return self.latent_vae.decode(latents)
