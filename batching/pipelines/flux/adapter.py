"""The FLUX.1 family (dev and schnell) behind the pipeline contract (a flow-matching family: `flow_matching`).

As `FluxPipeline` does it: latents are drawn as [1, 16, h/8, w/8] and packed into 2x2 patches,
[1, (h/16)*(w/16), 64]; the text conditioning is CLIP's pooled embedding plus T5's per-token
states (padded to `max_sequence_length`); the sampler's shift `mu` grows with the image's token
count. FLUX-dev is guidance-distilled: one row per sample, the guidance value a per-row model
input (so samples with different guidance share a forward); schnell has no guidance embedder and
ignores it. Outside deterministic mode a group mixes sizes: each row carries its own image
position ids, and a forward over rows whose positions differ runs packed (`flux.packed`: their
image tokens in one sequence, each row rotated by its own ids, attention per row); a forward over
rows alike runs diffusers' forward as is. Step caching is First-Block Cache (`flux.step_cache`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batching.pipelines import published_latent_rgb as published
from batching.pipelines.adapter_base import tokenize
from batching.pipelines.contract import CachedForward, CachedSample, Conditioning, ForwardBatch
from batching.pipelines.flow_matching import FlowMatchingAdapter
from batching.pipelines.flux import packed
from batching.pipelines.flux.packed import FluxLayout
from batching.pipelines.flux.step_cache import NUM_BLOCKS_KEPT, first_block_cached_blocks, num_flux_blocks
from batching.pipelines.packing import LayoutCache
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
        self.layouts: LayoutCache[tuple[FluxLayout, bool]] = LayoutCache()
        self.text_ids = torch.zeros(MAX_SEQUENCE_LENGTH, 3, device=device, dtype=dtype)  # every text token at (0, 0, 0)
        self.num_cache_blocks = num_flux_blocks(self.transformer)  # First-Block Cache (flux.step_cache)
        self.num_blocks_kept = NUM_BLOCKS_KEPT

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
        layout, is_uniform = self._layout(batch)
        inputs = self._inputs(batch)
        text_length = inputs["embeds"].shape[1]
        batch.count_positions([text_length + n for n in layout.image.lengths])
        if is_uniform:  # rows alike: diffusers' own forward
            assert isinstance(batch.latents, torch.Tensor)
            return self.transformer(
                hidden_states=batch.latents,
                timestep=inputs["timestep"],
                guidance=inputs["guidance"],
                pooled_projections=inputs["pooled"],
                encoder_hidden_states=inputs["embeds"],
                txt_ids=self.text_ids,
                img_ids=batch.conditioning["image_ids"][0],
                return_dict=False,
            )[0]
        predictions = packed.forward(self.transformer, layout, self._packed_latents(batch), **inputs)
        return batch.like_latents(layout.image.split(predictions[0]))

    @torch.inference_mode()
    def forward_cached(
        self, batch: ForwardBatch, samples: Sequence[CachedSample], *, may_gather: bool
    ) -> CachedForward:
        layout, _ = self._layout(batch)
        batch.count_positions([self.text_ids.shape[0] + n for n in layout.image.lengths])
        state = packed.embed(self.transformer, layout, self._packed_latents(batch), **self._inputs(batch))
        image, skipped = first_block_cached_blocks(
            self.transformer, layout, state, packed.run_blocks, samples, may_gather=may_gather
        )
        predictions = packed.output(self.transformer, image, state.temb, layout)  # [1, image tokens, 64]
        return CachedForward(batch.like_latents(layout.image.split(predictions[0])), skipped)

    def _inputs(self, batch: ForwardBatch) -> dict[str, Any]:
        """`packed.embed`'s inputs but the latents: each row's timestep in [0, 1], guidance, pooled and T5 states."""
        return {
            "timestep": batch.timesteps.to(batch.latents[0].dtype) / 1000,
            "guidance": batch.conditioning["guidance"] if self.has_guidance_embeds else None,
            "pooled": batch.conditioning["pooled"],
            "embeds": batch.conditioning["embeds"],  # [rows, 512, t5_dim]
        }

    def _packed_latents(self, batch: ForwardBatch) -> torch.Tensor:
        """[1, image tokens, 64]: every row's latent tokens, one after another."""
        return torch.cat(list(batch.latents))[None]

    def _layout(self, batch: ForwardBatch) -> tuple[FluxLayout, bool]:
        """The rows' packed layout, and whether every row has the same positions (diffusers' forward then runs as
        is: 128x192 and 192x128 have equal token counts, not equal positions)."""

        def build() -> tuple[FluxLayout, bool]:
            image_ids = batch.conditioning["image_ids"]  # [rows, most tokens, 3], zero-padded
            lengths = batch.row_lengths("image_ids")
            rows = [ids[:length] for ids, length in zip(image_ids, lengths)]
            is_uniform = len(set(lengths)) == 1 and bool((image_ids == image_ids[:1]).all())
            return packed.build_layout(self.transformer, self.text_ids, rows), is_uniform

        return self.layouts.get(batch.membership or None, build)

    def _image_ids(self, params: GenerationParams) -> torch.Tensor:
        """[tokens, 3] positions of the packed latent tokens: (0, row, column)."""
        return packed.position_ids(0, *self.token_grid(params)).to(self.device, self.dtype)
