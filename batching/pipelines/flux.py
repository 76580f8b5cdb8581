"""The FLUX.1 family (dev and schnell) behind the pipeline contract.

As `FluxPipeline` does it: latents are drawn as [1, 16, h/8, w/8] from the sample's own
generator and packed into 2x2 patches, [1, (h/16)*(w/16), 64]; the text conditioning is
CLIP's pooled embedding plus T5's per-token states (padded to `max_sequence_length`); the
sampler is flow-matching Euler whose shift `mu` grows with the image's token count.
FLUX-dev is guidance-distilled: one row per sample, the guidance value a per-row model
input (so samples with different guidance share a forward); schnell has no guidance
embedder and ignores it. Image and text position ids are the same for every row of a
group (its key holds the size); the forward takes the first row's image ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from diffusers.utils.torch_utils import randn_tensor

from batching.families import FAMILIES
from batching.params import GenerationParams
from batching.pipelines.contract import Conditioning, ForwardBatch
from batching.pipelines.flow_matching import flow_matching_sampler
from batching.pipelines.image_latents import ImageLatentsMixin
from batching.pipelines.loading import load_pipeline
from batching.pipelines.vae import decode_latents

MAX_SEQUENCE_LENGTH = 512  # FluxPipeline's default T5 length


class FluxAdapter(ImageLatentsMixin):
    family = "flux"
    max_rows_per_sample = 1

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.device = device
        self.dtype = dtype
        self.spec = FAMILIES[self.family]
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.vae = pipeline.vae
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self.has_guidance_embeds = bool(self.transformer.config.guidance_embeds)

    @classmethod
    def load(cls, model: str, source: str, device: torch.device, dtype: torch.dtype) -> FluxAdapter:
        from diffusers import FluxPipeline

        return cls(model, load_pipeline(FluxPipeline, model, source, device, dtype), device, dtype)

    def texts_to_encode(self, params: GenerationParams) -> list[str]:
        return [params.prompt]

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        pipeline = self.pipeline
        clip_ids = pipeline.tokenizer(
            list(texts), padding="max_length", max_length=pipeline.tokenizer.model_max_length, truncation=True,
            return_tensors="pt",
        ).input_ids.to(self.device)  # [n, 77]
        pooled = pipeline.text_encoder(clip_ids, output_hidden_states=False).pooler_output  # [n, clip_dim]
        t5_ids = pipeline.tokenizer_2(
            list(texts), padding="max_length", max_length=MAX_SEQUENCE_LENGTH, truncation=True, return_tensors="pt",
        ).input_ids.to(self.device)  # [n, 512]
        embeds = pipeline.text_encoder_2(t5_ids, output_hidden_states=False)[0]  # [n, 512, t5_dim]
        return [{"embeds": row.to(self.dtype), "pooled": pool.to(self.dtype)} for row, pool in zip(embeds, pooled)]

    def new_sampler(self, params: GenerationParams) -> Any:
        config = self.pipeline.scheduler.config
        return flow_matching_sampler(config, params.num_inference_steps, self._num_tokens(params), self.device)

    def draw_noise(self, params: GenerationParams, generator: torch.Generator) -> torch.Tensor:
        channels = self.transformer.config.in_channels // 4
        height, width = self._latent_size(params)
        noise = randn_tensor((1, channels, height, width), generator=generator, device=self.device, dtype=self.dtype)
        return self.pack_latents(noise)  # [1, tokens, 64]

    def initial_latents(self, params: GenerationParams, sampler: Any, generator: torch.Generator) -> torch.Tensor:
        return self.draw_noise(params, generator)

    def pack_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """[1, c, h, w] to 2x2 patches [1, (h/2)*(w/2), c*4], as FluxPipeline packs them."""
        _, channels, height, width = latents.shape
        packed = latents.view(1, channels, height // 2, 2, width // 2, 2).permute(0, 2, 4, 1, 3, 5)
        return packed.reshape(1, (height // 2) * (width // 2), channels * 4)

    def row_conditioning(self, params: GenerationParams, encoded: Mapping[str, Conditioning]) -> list[Conditioning]:
        guidance = torch.tensor(float(params.guidance_scale), device=self.device, dtype=torch.float32)
        return [{**encoded[params.prompt], "guidance": guidance, "image_ids": self._image_ids(params)}]

    def padding_row(self, params: GenerationParams) -> Conditioning:
        config = self.transformer.config
        zeros: dict[str, Any] = dict(device=self.device, dtype=self.dtype)
        return {
            "embeds": torch.zeros(MAX_SEQUENCE_LENGTH, config.joint_attention_dim, **zeros),
            "pooled": torch.zeros(config.pooled_projection_dim, **zeros),
            "guidance": torch.tensor(0.0, device=self.device),
            "image_ids": self._image_ids(params),
        }

    def model_input(self, sample: Any) -> torch.Tensor:
        return sample.latents

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        latents = batch.latents  # [rows, tokens, 64]
        assert isinstance(latents, torch.Tensor)  # one size per forward: FLUX does not mix sizes
        embeds = batch.conditioning["embeds"]  # [rows, 512, t5_dim]
        return self.transformer(
            hidden_states=latents,
            timestep=batch.timesteps.to(latents.dtype) / 1000,
            guidance=batch.conditioning["guidance"] if self.has_guidance_embeds else None,
            pooled_projections=batch.conditioning["pooled"],
            encoder_hidden_states=embeds,
            txt_ids=torch.zeros(embeds.shape[1], 3, device=self.device, dtype=self.dtype),
            img_ids=batch.conditioning["image_ids"][0],  # one size per group: every row's ids are the same
            return_dict=False,
        )[0]

    def guided_prediction(self, rows: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        return rows  # guidance went into the forward

    def decode(self, latents: torch.Tensor, params_list: Sequence[GenerationParams]) -> list[Any]:
        height, width = self._latent_size(params_list[0])
        channels = latents.shape[2] // 4
        unpacked = latents.view(latents.shape[0], height // 2, width // 2, channels, 2, 2).permute(0, 3, 1, 4, 2, 5)
        return decode_latents(self.vae, unpacked.reshape(latents.shape[0], channels, height, width))

    def _latent_size(self, params: GenerationParams) -> tuple[int, int]:
        """Latent height and width: the VAE's downsampling, rounded to whole 2x2 patches."""
        return (2 * (params.height // (self.vae_scale_factor * 2)), 2 * (params.width // (self.vae_scale_factor * 2)))

    def _image_ids(self, params: GenerationParams) -> torch.Tensor:
        """[tokens, 3] positions of the packed latent tokens: (0, row, column)."""
        height, width = (size // 2 for size in self._latent_size(params))
        ids = torch.zeros(height, width, 3)
        ids[..., 1] += torch.arange(height)[:, None]
        ids[..., 2] += torch.arange(width)[None, :]
        return ids.reshape(height * width, 3).to(self.device, self.dtype)

    def _num_tokens(self, params: GenerationParams) -> int:
        height, width = self._latent_size(params)
        return (height // 2) * (width // 2)
