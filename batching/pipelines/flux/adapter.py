"""The FLUX.1 family (dev and schnell) behind the pipeline contract (a flow-matching family: `flow_matching`).

As `FluxPipeline` does it: latents are drawn as [1, 16, h/8, w/8] and packed into 2x2 patches,
[1, (h/16)*(w/16), 64]; the text conditioning is CLIP's pooled embedding plus T5's per-token
states (padded to `max_sequence_length`); the sampler's shift `mu` grows with the image's token
count. FLUX-dev is guidance-distilled: one row per sample, the guidance value a per-row model
input (so samples with different guidance share a forward); schnell has no guidance embedder and
ignores it. Outside deterministic mode a group mixes sizes: each row carries its own image
position ids, and a forward over rows of different sizes pads their image tokens and runs the
attention of `flux.attention` (per-row positions, padding keys masked); a forward over rows of
one size runs diffusers' attention as is. Step caching is First-Block Cache (`flux.step_cache`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from batching.pipelines import published_latent_rgb as published
from batching.pipelines.adapter_base import tokenize
from batching.pipelines.contract import CachedForward, CachedSample, Conditioning, ForwardBatch
from batching.pipelines.flow_matching import FlowMatchingAdapter
from batching.pipelines.flux import attention
from batching.pipelines.flux.step_cache import LayoutOf, first_block_cached_forward
from batching.pipelines.mixed_sizes import LayoutCache, own_tokens, padded_tokens
from core.params import GenerationParams

MAX_SEQUENCE_LENGTH = 512  # FluxPipeline's default T5 length


class FluxAdapter(FlowMatchingAdapter):
    family = "flux"
    pipeline_classes = ("FluxPipeline",)
    published_latent_rgb = published.FLUX1
    token_patch = 2

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.has_guidance_embeds = bool(self.transformer.config.guidance_embeds)
        self.attention = attention.install(self.transformer)
        self.layouts = LayoutCache()
        blocks = self.transformer.transformer_blocks, self.transformer.single_transformer_blocks
        self.num_cache_blocks = sum(len(part) for part in blocks)
        self.num_blocks_kept = 1  # First-Block Cache (flux.step_cache): the first double-stream block decides

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        pipeline = self.pipeline
        clip_ids = tokenize(pipeline.tokenizer, texts).input_ids.to(self.device)  # [n, 77]
        pooled = pipeline.text_encoder(clip_ids, output_hidden_states=False).pooler_output  # [n, clip_dim]
        t5_ids = tokenize(pipeline.tokenizer_2, texts, MAX_SEQUENCE_LENGTH).input_ids.to(self.device)  # [n, 512]
        embeds = pipeline.text_encoder_2(t5_ids, output_hidden_states=False)[0]  # [n, 512, t5_dim]
        return [{"embeds": row.to(self.dtype), "pooled": pool.to(self.dtype)} for row, pool in zip(embeds, pooled)]

    def noise_shape(self, params: GenerationParams) -> tuple[int, ...]:
        return (1, self.transformer.config.in_channels // 4, *self.latent_grid(params))

    def row_extras(self, params: GenerationParams) -> Conditioning:
        guidance = torch.tensor(float(params.guidance_scale), device=self.device, dtype=torch.float32)
        return {"guidance": guidance, "image_ids": self._image_ids(params)}

    def padding_row(self, params: GenerationParams) -> Conditioning:
        config = self.transformer.config
        return {
            "embeds": self.zeros(MAX_SEQUENCE_LENGTH, config.joint_attention_dim),
            "pooled": self.zeros(config.pooled_projection_dim),
            "guidance": self.zeros(dtype=torch.float32),
            "image_ids": self._image_ids(params),
        }

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        latents, num_tokens, inputs = self._transformer_inputs(batch)
        with self._layout_of(inputs, num_tokens)(list(range(len(num_tokens)))):
            predictions = self.transformer(
                hidden_states=latents,
                timestep=inputs["timestep"],
                guidance=inputs["guidance"],
                pooled_projections=inputs["pooled"],
                encoder_hidden_states=inputs["embeds"],
                txt_ids=inputs["text_ids"],
                img_ids=inputs["img_ids"],  # the rows' own positions, when they differ, come from the layout
                return_dict=False,
            )[0]
        return own_tokens(batch.latents, predictions, num_tokens)

    @torch.inference_mode()
    def forward_cached(
        self, batch: ForwardBatch, samples: Sequence[CachedSample], *, may_gather: bool
    ) -> CachedForward:
        latents, num_tokens, inputs = self._transformer_inputs(batch)
        layout_of = self._layout_of(inputs, num_tokens)
        predictions, skipped = first_block_cached_forward(
            self.transformer, latents, num_tokens, inputs, samples, layout_of, may_gather=may_gather
        )
        return CachedForward(own_tokens(batch.latents, predictions, num_tokens), skipped)

    def _transformer_inputs(self, batch: ForwardBatch) -> tuple[torch.Tensor, list[int], dict[str, Any]]:
        embeds = batch.conditioning["embeds"]  # [rows, 512, t5_dim]
        image_ids = batch.conditioning["image_ids"]  # [rows, max tokens, 3], zero-padded
        latents, num_tokens = padded_tokens(batch.latents)  # [rows, max tokens, 64]
        inputs = {
            "timestep": batch.timesteps.to(latents.dtype) / 1000,
            "guidance": batch.conditioning["guidance"] if self.has_guidance_embeds else None,
            "pooled": batch.conditioning["pooled"],
            "embeds": embeds,
            "text_ids": torch.zeros(embeds.shape[1], 3, device=self.device, dtype=self.dtype),
            "img_ids": image_ids[0],
            "image_ids": image_ids,
        }
        return latents, num_tokens, inputs

    def _layout_of(self, inputs: dict[str, Any], num_tokens: list[int]) -> LayoutOf:
        """Batch rows -> the attention layout of a forward over them (none when the batch is of one size)."""
        image_ids, text_ids = inputs["image_ids"], inputs["text_ids"]
        is_uniform = bool((image_ids == image_ids[:1]).all())  # 128x192 and 192x128 have equal token counts

        def layout_of(rows: list[int]) -> contextlib.AbstractContextManager:
            if is_uniform:
                return contextlib.nullcontext()
            if len(rows) == len(num_tokens):
                lengths = (tuple(num_tokens), text_ids.shape[0])
                build = lambda: attention.row_layout(self.transformer, text_ids, image_ids, num_tokens)  # noqa: E731
                return self.attention.rows(self.layouts.get(image_ids, lengths, build))
            some = [num_tokens[row] for row in rows]
            return self.attention.rows(attention.row_layout(self.transformer, text_ids, image_ids[rows], some))

        return layout_of

    def _image_ids(self, params: GenerationParams) -> torch.Tensor:
        """[tokens, 3] positions of the packed latent tokens: (0, row, column)."""
        return attention.position_ids(0, *self.token_grid(params)).to(self.device, self.dtype)
