"""The Z-Image family behind the pipeline contract.

As `ZImagePipeline` does it: the prompt is wrapped in the Qwen3 chat template, padded to
`max_sequence_length` for the text encoder, and the penultimate hidden states of its real
tokens (a different count per prompt) are the conditioning; latents [1, 16, h/8, w/8] are
drawn in float32 from the sample's own generator; the sampler is flow-matching Euler
(`flow_matching`); the transformer takes a list of latents and a list of caption features (and pads
rows of different lengths to the longest with attention masks: rows alike run it as is, others run
packed, `zimage.packed`, without that padding). Guidance is classifier-free for any scale above 0, with
the pipeline's own formula `cond + scale * (cond - uncond)`, and the model predicts the negated
velocity. Samples of different sizes share a forward: the family's key holds no size (except in
deterministic mode).
Step caching decides from the first main block's modulated input, as TeaCache, and skips
the main blocks (`batching.pipelines.zimage.step_cache`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batching.pipelines import published_latent_rgb as published
from batching.pipelines.adapter_base import tokenize
from batching.pipelines.contract import CachedForward, CachedSample, Conditioning, ForwardBatch
from batching.pipelines.flow_matching import FlowMatchingAdapter
from batching.pipelines.packing import LayoutCache
from batching.pipelines.zimage import packed
from batching.pipelines.zimage.packed import ZImageLayout
from batching.pipelines.zimage.step_cache import NUM_BLOCKS_KEPT, residual_cached_forward
from core.params import GenerationParams

MAX_SEQUENCE_LENGTH = 512  # ZImagePipeline's default


class ZImageAdapter(FlowMatchingAdapter):
    latent_dtype = torch.float32  # as ZImagePipeline keeps its latents
    family = "zimage"
    pipeline_classes = ("ZImagePipeline",)
    published_latent_rgb = published.FLUX1

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.num_cache_blocks = len(self.transformer.layers)  # the main blocks, which a skip saves (zimage.step_cache)
        self.num_blocks_kept = NUM_BLOCKS_KEPT
        self.layouts: LayoutCache[tuple[ZImageLayout, bool]] = LayoutCache()

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        tokenizer = self.pipeline.tokenizer
        tokens = tokenize(tokenizer, chat_prompts(tokenizer, texts), MAX_SEQUENCE_LENGTH)
        input_ids = tokens.input_ids.to(self.device)  # [n, 512]
        masks = tokens.attention_mask.to(self.device).bool()  # [n, 512]
        hidden = self.pipeline.text_encoder(
            input_ids=input_ids, attention_mask=masks, output_hidden_states=True
        ).hidden_states[-2]  # [n, 512, dim]
        return [{"embeds": row[mask].to(self.dtype)} for row, mask in zip(hidden, masks)]  # [tokens_i, dim]

    def noise_shape(self, params: GenerationParams) -> tuple[int, ...]:
        return (1, self.transformer.in_channels, *self.latent_grid(params))  # [1, 16, h/8, w/8]

    def padding_row(self, params: GenerationParams) -> Conditioning:
        """Caption features of the longest length, so every padded forward pads its captions alike."""
        return {"embeds": self.zeros(MAX_SEQUENCE_LENGTH, self.transformer.config.cap_feat_dim)}

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        latents, t, captions = self._transformer_inputs(batch)
        layout, is_uniform = self._layout(batch, latents)
        batch.count_positions([i + c for i, c in zip(layout.image.lengths, layout.captions.lengths)])
        if is_uniform:  # rows alike: diffusers' own forward (which pads rows of different lengths)
            outputs = self.transformer(latents, t, captions, return_dict=False)[0]
        else:
            outputs = packed.forward(self.transformer, layout, latents, t, captions)
        return self._predictions(batch, outputs)

    @torch.inference_mode()
    def forward_cached(
        self, batch: ForwardBatch, samples: Sequence[CachedSample], *, may_gather: bool
    ) -> CachedForward:
        latents, t, captions = self._transformer_inputs(batch)
        layout, _ = self._layout(batch, latents)
        batch.count_positions([i + c for i, c in zip(layout.image.lengths, layout.captions.lengths)])
        outputs, skipped = residual_cached_forward(
            self.transformer, layout, latents, t, captions, samples, may_gather=may_gather
        )
        return CachedForward(self._predictions(batch, outputs), skipped)

    def _transformer_inputs(self, batch: ForwardBatch) -> tuple[list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
        embeds = batch.conditioning["embeds"]  # [rows, max_tokens, dim]
        lengths = batch.row_lengths("embeds")
        dtype = self.transformer.dtype
        latents = [row.to(dtype).unsqueeze(1) for row in batch.latents]  # per row [16, 1, h, w]: one frame
        captions = [row[:length] for row, length in zip(embeds, lengths)]
        return latents, (1000 - batch.timesteps) / 1000, captions

    def _layout(self, batch: ForwardBatch, latents: list[torch.Tensor]) -> tuple[ZImageLayout, bool]:
        """The rows' packed layout, and whether every row's sequences are as long as the others' (diffusers' forward
        then pads nothing)."""
        sizes = [(row.shape[1], row.shape[2], row.shape[3]) for row in latents]  # (frames, h, w) per row
        caption_lengths = batch.row_lengths("embeds")

        def build() -> tuple[ZImageLayout, bool]:
            layout = packed.build_layout(self.transformer, sizes, caption_lengths, self.device)
            rows = list(zip(layout.image.lengths, layout.captions.lengths))
            return layout, len(set(rows)) == 1

        key = (tuple(sizes), tuple(caption_lengths))  # all a row's positions follow from
        return self.layouts.get(key, build)

    def _predictions(self, batch: ForwardBatch, outputs: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        """Per row [16, h, w]."""
        return batch.like_latents([output.float().squeeze(1) for output in outputs])

    def guided_prediction(self, rows: torch.Tensor, params: GenerationParams, timestep: torch.Tensor) -> torch.Tensor:
        cond = rows[0:1]
        if len(rows) == 2:
            cond = cond + params.guidance_scale * (cond - rows[1:2])  # the pipeline's own formula
        return -cond  # the transformer predicts the negated flow


def chat_prompts(tokenizer: Any, texts: Sequence[str]) -> list[str]:
    """Each prompt in Qwen3's chat template, as ZImagePipeline wraps it (builtin:shapes-dit's training too)."""
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True, enable_thinking=True
        )
        for text in texts
    ]
