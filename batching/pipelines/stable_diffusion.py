"""The Stable Diffusion family (SD 1.x/2.x UNets) behind the pipeline contract.

A sample with classifier-free guidance puts two rows into each forward, [uncond, cond],
and its own guidance scale combines them afterwards; a sample without it puts one row.
The UNet takes one timestep per row, so samples at different steps share a forward.
`StableDiffusionXLAdapter` extends this with SDXL's added conditioning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from diffusers.utils.torch_utils import randn_tensor

from batching.params import GenerationParams
from batching.pipelines.adapter_base import AdapterBase, tokenize
from batching.pipelines.contract import Conditioning, ForwardBatch
from batching.pipelines.vae import decode_latents
from batching.samplers import make_sampler


class StableDiffusionAdapter(AdapterBase):
    family = "sd"
    pipeline_classes = ("StableDiffusionPipeline",)
    load_options = {"safety_checker": None, "feature_extractor": None, "requires_safety_checker": False}
    max_rows_per_sample = 2

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.unet = pipeline.unet
        self.scheduler_config = pipeline.scheduler.config

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        tokenizer, text_encoder = self.pipeline.tokenizer, self.pipeline.text_encoder
        tokens = tokenize(tokenizer, texts)
        input_ids = tokens.input_ids.to(self.device)  # [n, seq]
        uses_mask = getattr(text_encoder.config, "use_attention_mask", False)
        attention_mask = tokens.attention_mask.to(self.device) if uses_mask else None
        embeds = text_encoder(input_ids, attention_mask=attention_mask)[0].to(self.dtype)  # [n, seq, dim]
        return [{"embeds": row} for row in embeds]

    def new_sampler(self, params: GenerationParams) -> Any:
        return make_sampler(params.sampler, self.scheduler_config, params.num_inference_steps, self.device)

    def draw_noise(self, params: GenerationParams, generator: torch.Generator) -> torch.Tensor:
        shape = (
            1,
            self.unet.config.in_channels,
            params.height // self.vae_scale_factor,
            params.width // self.vae_scale_factor,
        )
        return randn_tensor(shape, generator=generator, device=self.device, dtype=self.dtype)  # [1, c, h/8, w/8]

    def initial_latents(self, params: GenerationParams, sampler: Any, generator: torch.Generator) -> torch.Tensor:
        return self.draw_noise(params, generator) * sampler.init_noise_sigma

    def row_conditioning(self, params: GenerationParams, encoded: Mapping[str, Conditioning]) -> list[Conditioning]:
        if self.spec.has_cfg(params.guidance_scale):
            return [encoded[params.negative_prompt], encoded[params.prompt]]
        return [encoded[params.prompt]]

    def padding_row(self, params: GenerationParams) -> Conditioning:
        tokenizer, text_encoder = self.pipeline.tokenizer, self.pipeline.text_encoder
        return {
            "embeds": torch.zeros(
                tokenizer.model_max_length, text_encoder.config.hidden_size, device=self.device, dtype=self.dtype
            )
        }

    def model_input(self, sample: Any) -> torch.Tensor:
        return sample.sampler.scale_model_input(sample.latents, sample.timestep)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.unet(
            batch.latents,
            batch.timesteps,
            encoder_hidden_states=batch.conditioning["embeds"],
            added_cond_kwargs=self.added_cond_kwargs(batch),
            return_dict=False,
        )[0]

    def added_cond_kwargs(self, batch: ForwardBatch) -> dict[str, torch.Tensor] | None:
        return None

    def guided_prediction(self, rows: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        if len(rows) == 1:
            return rows
        uncond, cond = rows[0:1], rows[1:2]
        return uncond + params.guidance_scale * (cond - uncond)

    def decode(self, latents: torch.Tensor, params_list: Sequence[GenerationParams]) -> list[Any]:
        return decode_latents(self.vae, latents)
