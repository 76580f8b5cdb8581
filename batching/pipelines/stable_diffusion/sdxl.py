"""The SDXL family behind the pipeline contract: the SD adapter plus SDXL's added conditioning.

What SDXL adds, as `StableDiffusionXLPipeline` computes it: two CLIP text encoders whose
penultimate hidden states are concatenated per token; the second encoder's projected
pooled embedding; and per-sample time ids (original size, crop corner, target size)
that depend on the sample's own height and width. Pooled embeddings and time ids travel
as named per-row conditioning, so samples of different prompts share the UNet forward.
With `force_zeros_for_empty_prompt` (SDXL base), a sample without a negative prompt
guides against zeros, exactly as the diffusers pipeline does when no negative prompt is
given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from batching.pipelines import published_latent_rgb as published
from batching.pipelines.adapter_base import clip_prompt_states
from batching.pipelines.contract import Conditioning, ForwardBatch
from batching.pipelines.stable_diffusion.adapter import StableDiffusionAdapter
from core.errors import ModelLoadError
from core.params import GenerationParams


class StableDiffusionXLAdapter(StableDiffusionAdapter):
    family = "sdxl"
    pipeline_classes = ("StableDiffusionXLPipeline", "StableDiffusionXLInpaintPipeline")  # 4- or 9-channel UNet
    load_options = {}
    published_latent_rgb = published.SDXL

    @classmethod
    def load(cls, model: str, source: str, device: torch.device, dtype: torch.dtype) -> StableDiffusionXLAdapter:
        from diffusers import DiffusionPipeline

        if DiffusionPipeline.load_config(source, local_files_only=True).get("requires_aesthetics_score"):
            raise ModelLoadError(  # a refiner-style checkpoint: its UNet takes aesthetic scores among the time ids
                f"model {model!r} conditions on aesthetic scores (requires_aesthetics_score), which this engine "
                "does not serve; SDXL base and base inpainting checkpoints are served"
            )
        return super().load(model, source, device, dtype)

    @property
    def zeros_for_empty_negative(self) -> bool:
        return bool(self.pipeline.config.get("force_zeros_for_empty_prompt", False))

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        pipeline = self.pipeline
        encoders = [(pipeline.tokenizer, pipeline.text_encoder), (pipeline.tokenizer_2, pipeline.text_encoder_2)]
        per_token, pooled = clip_prompt_states(encoders, texts, self.device)
        embeds = torch.cat(per_token, dim=-1).to(self.dtype)  # [n, seq, width_1 + width_2]
        assert pooled  # SDXL's second text encoder projects: its text embeds are the pooled embedding
        return [{"embeds": row, "pooled": pool.to(self.dtype)} for row, pool in zip(embeds, pooled[0])]

    def row_extras(self, params: GenerationParams) -> Conditioning:
        time_ids = torch.tensor(  # original size, crop top-left, target size
            [params.height, params.width, 0, 0, params.height, params.width], device=self.device, dtype=self.dtype
        )
        return {"time_ids": time_ids}

    def unconditional(self, params: GenerationParams, encoded: Mapping[str, Conditioning]) -> Conditioning:
        if self._guides_against_zeros(params):
            return {name: torch.zeros_like(tensor) for name, tensor in encoded[params.prompt].items()}
        return encoded[params.negative_prompt]

    def texts_to_encode(self, params: GenerationParams) -> list[str]:
        return [params.prompt] if self._guides_against_zeros(params) else super().texts_to_encode(params)

    def _guides_against_zeros(self, params: GenerationParams) -> bool:
        return params.negative_prompt == "" and self.zeros_for_empty_negative

    def padding_row(self, params: GenerationParams) -> Conditioning:
        pipeline = self.pipeline
        width = pipeline.text_encoder.config.hidden_size + pipeline.text_encoder_2.config.hidden_size
        return {
            "embeds": self.zeros(pipeline.tokenizer_2.model_max_length, width),
            "pooled": self.zeros(pipeline.text_encoder_2.config.projection_dim),
            "time_ids": self.zeros(6),
            **self.mask_channels_padding(params),
        }

    def added_cond_kwargs(self, batch: ForwardBatch) -> dict[str, torch.Tensor]:
        return {"text_embeds": batch.conditioning["pooled"], "time_ids": batch.conditioning["time_ids"]}
