"""The Stable Diffusion 3 family (SD3 and SD3.5: Medium, Large, Large Turbo) behind the pipeline contract.

As `StableDiffusion3Pipeline` does it: three text encoders, each called once on all of an
iteration's texts. The two CLIP encoders (with projection) give their penultimate hidden
states, concatenated per token and zero-padded to T5's width, and their pooled projections,
concatenated; T5 gives 256 token states (zeros when the checkpoint was loaded without T5).
A text's conditioning is [77 CLIP tokens | 256 T5 tokens] plus the pooled vector. Latents
[1, 16, h/8, w/8] are drawn from the sample's own generator; the sampler is flow-matching
Euler with the model's shift (and its size-dependent `mu` where the scheduler shifts
dynamically); guidance is classifier-free above 1, rows [uncond, cond], an empty negative
prompt encoded as the empty text. Decode undoes the VAE's scaling and shift factors. A flow-matching
family (`flow_matching`): its sampler's sigmas are the scheduler's own, as its pipeline leaves them.

Outside deterministic mode a group mixes sizes: a forward over rows of different sizes
runs packed (`sd3.packed`: each row patch-embedded with its own positions, the image tokens in one
sequence, attention per row); a forward over rows of one size runs diffusers' transformer as is. Step
caching is First-Block Cache (`forward_cached`), as FLUX's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from batching.pipelines import published_latent_rgb as published
from batching.pipelines.adapter_base import clip_prompt_states, tokenize
from batching.pipelines.contract import CachedForward, CachedSample, Conditioning, ForwardBatch
from batching.pipelines.flow_matching import FlowMatchingAdapter
from batching.pipelines.packing import LayoutCache
from batching.pipelines.sd3 import packed
from batching.pipelines.sd3.packed import SD3Layout
from batching.pipelines.step_cache_rows import cached_blocks, first_block_features
from core.errors import ModelLoadError
from core.params import GenerationParams

MAX_SEQUENCE_LENGTH = 256  # StableDiffusion3Pipeline's default T5 length


class StableDiffusion3Adapter(FlowMatchingAdapter):
    family = "sd3"
    pipeline_classes = ("StableDiffusion3Pipeline",)
    published_latent_rgb = published.SD3
    uncond_first = True
    default_max_shift = 1.16  # StableDiffusion3Pipeline's

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        config = self.transformer.config
        if not config.pos_embed_max_size:
            raise ModelLoadError(f"model {model!r} has no pos_embed_max_size: its patch positions cannot be cropped")
        self.max_latent_size = config.pos_embed_max_size * config.patch_size  # latent pixels per side
        self.layouts: LayoutCache[SD3Layout] = LayoutCache()
        self.num_cache_blocks = len(self.transformer.transformer_blocks)  # the joint blocks (First-Block Cache)
        self.num_blocks_kept = 1  # the first runs on every row: its residual decides

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        pipeline = self.pipeline
        encoders = [(pipeline.tokenizer, pipeline.text_encoder), (pipeline.tokenizer_2, pipeline.text_encoder_2)]
        clip_states, clip_pooled = clip_prompt_states(encoders, texts, self.device, pipeline.tokenizer_max_length)
        t5_states = self._t5_states(texts)  # [n, 256, t5_width]
        clip = torch.cat(clip_states, dim=-1)  # [n, 77, width_1 + width_2]
        clip = torch.nn.functional.pad(clip, (0, t5_states.shape[-1] - clip.shape[-1]))
        embeds = torch.cat([clip.to(self.dtype), t5_states.to(self.dtype)], dim=-2)  # [n, 77 + 256, t5_width]
        pooled = torch.cat(clip_pooled, dim=-1).to(self.dtype)  # [n, projection_1 + projection_2]
        return [{"embeds": row, "pooled": pool} for row, pool in zip(embeds, pooled)]

    def _t5_states(self, texts: Sequence[str]) -> torch.Tensor:
        pipeline = self.pipeline
        if pipeline.text_encoder_3 is None:  # loaded without T5 (`text_encoder_3=None`): the pipeline uses zeros
            return self.zeros(len(texts), MAX_SEQUENCE_LENGTH, self.transformer.config.joint_attention_dim)
        input_ids = tokenize(pipeline.tokenizer_3, texts, MAX_SEQUENCE_LENGTH).input_ids.to(self.device)
        return pipeline.text_encoder_3(input_ids)[0]

    def sigmas(self, params: GenerationParams) -> np.ndarray | None:
        return None  # `num_inference_steps` between the scheduler's own shifted sigma bounds

    def noise_shape(self, params: GenerationParams) -> tuple[int, ...]:
        height, width = self.latent_grid(params, patch=1)
        if max(height, width) > self.max_latent_size:  # the model's position table ends there
            largest = self.max_latent_size * self.vae_scale_factor
            raise ValueError(f"height and width must be at most {largest} for model {self.model!r}")
        return (1, self.transformer.config.in_channels, height, width)  # [1, 16, h/8, w/8]

    def padding_row(self, params: GenerationParams) -> Conditioning:
        config = self.transformer.config
        num_text_tokens = self.pipeline.tokenizer_max_length + MAX_SEQUENCE_LENGTH
        return {
            "embeds": self.zeros(num_text_tokens, config.joint_attention_dim),
            "pooled": self.zeros(config.pooled_projection_dim),
        }

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        embeds = batch.conditioning["embeds"]  # [rows, 333, t5_width]
        pooled = batch.conditioning["pooled"]  # [rows, pooled_width]
        grids = self._grids(batch)
        if isinstance(batch.latents, list):  # sizes differ
            layout = self._layout(grids, embeds.shape[1])
            return packed.forward(self.transformer, layout, batch.latents, batch.timesteps, embeds, pooled)
        return self.transformer(
            hidden_states=batch.latents,  # [rows, 16, h, w]
            timestep=batch.timesteps,
            encoder_hidden_states=embeds,
            pooled_projections=pooled,
            return_dict=False,
        )[0]

    @torch.inference_mode()
    def forward_cached(
        self, batch: ForwardBatch, samples: Sequence[CachedSample], *, may_gather: bool
    ) -> CachedForward:
        """First-Block Cache: the first joint block runs on every row and its residual on the image tokens decides
        (`step_cache_rows`); the other blocks run on the rows that compute, packed on their own."""
        model, conditioning = self.transformer, batch.conditioning
        layout = self._layout(self._grids(batch), conditioning["embeds"].shape[1])
        image, text, temb = packed.embed(
            model, layout, list(batch.latents), batch.timesteps, conditioning["embeds"], conditioning["pooled"]
        )
        first, first_text = packed.run_blocks(model.transformer_blocks[:1], image, text, temb, layout)
        assert first_text is not None  # the last block alone leaves no text; a model has more than one
        rest = model.transformer_blocks[1:]

        def run_rest(rows: Sequence[int] | None, part: torch.Tensor) -> torch.Tensor:
            if rows is None:
                return packed.run_blocks(rest, part, first_text, temb, layout)[0]
            return packed.run_blocks(rest, part, first_text[rows], temb[rows], layout.select(rows))[0]

        features = first_block_features(image, first, layout.image)
        out, skipped = cached_blocks(samples, features, first, layout.image, run_rest, may_gather=may_gather)
        return CachedForward(batch.like_latents(packed.output(model, layout, out, temb)), skipped)

    def _grids(self, batch: ForwardBatch) -> tuple[tuple[int, int], ...]:
        """Each row's (height, width) in patches; counts the forward's positions (its text's and its patches')."""
        patch = self.transformer.config.patch_size
        grids = tuple((row.shape[-2] // patch, row.shape[-1] // patch) for row in batch.latents)
        num_text = batch.conditioning["embeds"].shape[1]
        batch.count_positions([num_text + height * width for height, width in grids])
        return grids

    def _layout(self, grids: tuple[tuple[int, int], ...], num_text: int) -> SD3Layout:
        """The packed layout of rows of `grids` (kept per set of grids)."""
        return self.layouts.get(grids, lambda: packed.build_layout(grids, num_text, self.device))
