"""The Stable Diffusion 3 family (SD3 and SD3.5: Medium, Large, Large Turbo) behind the pipeline contract.

As `StableDiffusion3Pipeline` does it: three text encoders, each called once on all of an
iteration's texts. The two CLIP encoders (with projection) give their penultimate hidden
states, concatenated per token and zero-padded to T5's width, and their pooled projections,
concatenated; T5 gives 256 token states (zeros when the checkpoint was loaded without T5).
A text's conditioning is [77 CLIP tokens | 256 T5 tokens] plus the pooled vector. Latents
[1, 16, h/8, w/8] are drawn from the sample's own generator; the sampler is flow-matching
Euler with the model's shift (and its size-dependent `mu` where the scheduler shifts
dynamically); guidance is classifier-free above 1, rows [uncond, cond], an empty negative
prompt encoded as the empty text. Decode undoes the VAE's scaling and shift factors.

Outside deterministic mode a group mixes sizes: a forward over rows of different sizes
runs `sd3_mixed_sizes` (per-row patch positions, padded image tokens, masked keys); a
forward over rows of one size runs diffusers' transformer as is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from diffusers.utils.torch_utils import randn_tensor

from batching.pipelines import published_latent_rgb as published
from batching.pipelines.adapter_base import AdapterBase, tokenize
from batching.pipelines.contract import Conditioning, ForwardBatch, RunningSample
from batching.pipelines.flow_matching import FlowMatchSampler
from batching.pipelines.sd3_mixed_sizes import MixedSizeJointAttnProcessor, mixed_size_forward
from batching.pipelines.vae import decode_latents
from core.errors import ModelLoadError
from core.params import GenerationParams

MAX_SEQUENCE_LENGTH = 256  # StableDiffusion3Pipeline's default T5 length


class StableDiffusion3Adapter(AdapterBase):
    family = "sd3"
    pipeline_classes = ("StableDiffusion3Pipeline",)
    max_rows_per_sample = 2
    published_latent_rgb = published.SD3

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.transformer = pipeline.transformer
        config = self.transformer.config
        if not config.pos_embed_max_size:
            raise ModelLoadError(f"model {model!r} has no pos_embed_max_size: its patch positions cannot be cropped")
        self.patch_size = config.patch_size
        self.max_latent_size = config.pos_embed_max_size * config.patch_size  # latent pixels per side
        self.attention = MixedSizeJointAttnProcessor()
        self.transformer.set_attn_processor(self.attention)

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        pipeline = self.pipeline
        clip_states, clip_pooled = [], []
        for tokenizer, text_encoder in (
            (pipeline.tokenizer, pipeline.text_encoder),
            (pipeline.tokenizer_2, pipeline.text_encoder_2),
        ):
            input_ids = tokenize(tokenizer, texts, pipeline.tokenizer_max_length).input_ids.to(self.device)  # [n, 77]
            output = text_encoder(input_ids, output_hidden_states=True)
            clip_pooled.append(output[0])  # [n, projection_dim]: the projected pooled output
            clip_states.append(output.hidden_states[-2])  # [n, 77, width]
        t5_states = self._t5_states(texts)  # [n, 256, t5_width]
        clip = torch.cat(clip_states, dim=-1)  # [n, 77, width_1 + width_2]
        clip = torch.nn.functional.pad(clip, (0, t5_states.shape[-1] - clip.shape[-1]))
        embeds = torch.cat([clip.to(self.dtype), t5_states.to(self.dtype)], dim=-2)  # [n, 77 + 256, t5_width]
        pooled = torch.cat(clip_pooled, dim=-1).to(self.dtype)  # [n, projection_1 + projection_2]
        return [{"embeds": row, "pooled": pool} for row, pool in zip(embeds, pooled)]

    def _t5_states(self, texts: Sequence[str]) -> torch.Tensor:
        pipeline = self.pipeline
        if pipeline.text_encoder_3 is None:  # loaded without T5 (`text_encoder_3=None`): the pipeline uses zeros
            width = self.transformer.config.joint_attention_dim
            return torch.zeros(len(texts), MAX_SEQUENCE_LENGTH, width, device=self.device, dtype=self.dtype)
        input_ids = tokenize(pipeline.tokenizer_3, texts, MAX_SEQUENCE_LENGTH).input_ids.to(self.device)
        return pipeline.text_encoder_3(input_ids)[0]

    def new_sampler(self, params: GenerationParams) -> Any:
        """The pipeline's schedule: `num_inference_steps` between the scheduler's own shifted sigma bounds."""
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        config = self.pipeline.scheduler.config
        sampler = FlowMatchSampler.from_config(config)
        shift: dict[str, float] = {}
        if config.get("use_dynamic_shifting"):
            height, width = self._latent_size(params)
            shift["mu"] = calculate_shift(
                (height // self.patch_size) * (width // self.patch_size),
                config.get("base_image_seq_len", 256),
                config.get("max_image_seq_len", 4096),
                config.get("base_shift", 0.5),
                config.get("max_shift", 1.16),
            )
        sampler.set_timesteps(params.num_inference_steps, device=self.device, **shift)
        sampler.set_begin_index(0)
        return sampler

    def draw_noise(self, params: GenerationParams, generator: torch.Generator) -> torch.Tensor:
        height, width = self._latent_size(params)
        if max(height, width) > self.max_latent_size:  # the model's position table ends there
            largest = self.max_latent_size * self.vae_scale_factor
            raise ValueError(f"height and width must be at most {largest} for model {self.model!r}")
        shape = (1, self.transformer.config.in_channels, height, width)
        return randn_tensor(shape, generator=generator, device=self.device, dtype=self.dtype)  # [1, 16, h/8, w/8]

    def initial_latents(self, params: GenerationParams, sampler: Any, generator: torch.Generator) -> torch.Tensor:
        return self.draw_noise(params, generator)

    def row_conditioning(self, params: GenerationParams, encoded: Mapping[str, Conditioning]) -> list[Conditioning]:
        if self.spec.has_cfg(params.guidance_scale, params.negative_prompt):
            return [encoded[params.negative_prompt], encoded[params.prompt]]
        return [encoded[params.prompt]]

    def padding_row(self, params: GenerationParams) -> Conditioning:
        config = self.transformer.config
        num_text_tokens = self.pipeline.tokenizer_max_length + MAX_SEQUENCE_LENGTH
        zeros: dict[str, Any] = dict(device=self.device, dtype=self.dtype)
        return {
            "embeds": torch.zeros(num_text_tokens, config.joint_attention_dim, **zeros),
            "pooled": torch.zeros(config.pooled_projection_dim, **zeros),
        }

    def model_input(self, sample: RunningSample) -> torch.Tensor:
        return sample.latents

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        embeds = batch.conditioning["embeds"]  # [rows, 333, t5_width]
        pooled = batch.conditioning["pooled"]  # [rows, pooled_width]
        if isinstance(batch.latents, list):  # sizes differ: pad the image tokens, mask the padding
            return mixed_size_forward(self.transformer, self.attention, batch.latents, batch.timesteps, embeds, pooled)
        return self.transformer(
            hidden_states=batch.latents,  # [rows, 16, h, w]
            timestep=batch.timesteps,
            encoder_hidden_states=embeds,
            pooled_projections=pooled,
            return_dict=False,
        )[0]

    def guided_prediction(self, rows: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        if len(rows) == 1:
            return rows
        uncond, cond = rows[0:1], rows[1:2]
        return uncond + params.guidance_scale * (cond - uncond)

    def decode(self, latents: torch.Tensor, params_list: Sequence[GenerationParams]) -> list[Any]:
        return decode_latents(self.vae, latents)

    def _latent_size(self, params: GenerationParams) -> tuple[int, int]:
        return params.height // self.vae_scale_factor, params.width // self.vae_scale_factor
