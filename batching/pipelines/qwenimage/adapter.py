"""The Qwen-Image family behind the pipeline contract (a flow-matching family: `flow_matching`).

As `QwenImagePipeline` does it: the prompt goes into the pipeline's own template, the Qwen2.5-VL
text encoder runs on it (prompts of one call padded to the longest, with their mask), and the last
hidden states of each prompt's real tokens, less the template's system part
(`prompt_template_encode_start_idx` tokens) and cut at 512, are its conditioning, of each prompt's
own length; latents are drawn as [1, 1, 16, h/8, w/8] and packed into 2x2 patches,
[1, (h/16)*(w/16), 64]. Guidance is true classifier-free guidance: `guidance_scale` is the
pipeline's `true_cfg_scale`, run (two rows, [cond, uncond]) only above 1 with a negative prompt,
combined as the pipeline does (CFG, then rescaled to the conditional prediction's norm per token).
Its VAE is a causal video VAE (`batching.pipelines.vae`).

Rows of every size and prompt length share a forward (the family's key holds no size outside
deterministic mode): rows whose image shapes or prompt lengths differ run packed (`qwenimage.packed`:
their image and text tokens each in one sequence, each row rotated by its own positions, attention
per row); rows alike run diffusers' forward as is. The edit model (`qwenimage.edit`) extends this adapter: its rows
carry the edit image's latents after their own. Step caching is First-Block Cache (`forward_cached`), as
FLUX's: an edit row's residual covers its edit image's tokens too.
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
from batching.pipelines.qwenimage import packed
from batching.pipelines.qwenimage.packed import ImageShapes, QwenLayout
from batching.pipelines.step_cache_rows import cached_blocks, first_block_features
from core.params import GenerationParams

MAX_SEQUENCE_LENGTH = 512  # QwenImagePipeline's default: prompt states past it are cut
TOKENIZER_MAX_LENGTH = 1024  # the pipeline's tokenizer_max_length (plus the template's system part)


class QwenImageAdapter(FlowMatchingAdapter):
    family = "qwenimage"
    pipeline_classes = ("QwenImagePipeline",)
    guidance_argument = "true_cfg_scale"
    published_latent_rgb = published.WAN21
    token_patch = 2

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.latent_channels = self.transformer.config.in_channels // 4
        self.layouts: LayoutCache[tuple[QwenLayout, list[ImageShapes]]] = LayoutCache()
        self.num_cache_blocks = len(self.transformer.transformer_blocks)  # First-Block Cache (`forward_cached`)
        self.num_blocks_kept = 1  # the first block runs on every row: its residual decides

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        if not texts:
            return []
        pipeline = self.pipeline
        drop = pipeline.prompt_template_encode_start_idx
        templated = [pipeline.prompt_template_encode.format(text) for text in texts]
        tokens = tokenize(pipeline.tokenizer, templated, TOKENIZER_MAX_LENGTH + drop, padding="longest").to(self.device)
        hidden = pipeline.text_encoder(
            input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, output_hidden_states=True
        ).hidden_states[-1]  # [n, longest, dim]
        masks = tokens.attention_mask.bool()
        return [{"embeds": row[mask][drop:][:MAX_SEQUENCE_LENGTH].to(self.dtype)} for row, mask in zip(hidden, masks)]

    def noise_shape(self, params: GenerationParams) -> tuple[int, ...]:
        return (1, 1, self.latent_channels, *self.latent_grid(params))  # the pipeline's: a frame axis first

    def row_extras(self, params: GenerationParams) -> Conditioning:
        return {"image_shapes": self._image_shapes(params)}

    def padding_row(self, params: GenerationParams) -> Conditioning:
        """Prompt states of the longest length, so every padded forward pads its prompts alike."""
        embeds = self.zeros(MAX_SEQUENCE_LENGTH, self.transformer.config.joint_attention_dim)
        return {"embeds": embeds, **self.row_extras(params)}

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        rows, layout, shapes, timestep = self._inputs(batch)
        embeds = batch.conditioning["embeds"]  # [rows, longest prompt, dim], zero-padded
        text_lengths = batch.row_lengths("embeds")
        if len(set(map(repr, shapes))) == 1 and len(set(text_lengths)) == 1:  # rows alike: diffusers' forward
            predictions = self.transformer(
                hidden_states=torch.stack(rows),
                timestep=timestep,
                encoder_hidden_states=embeds,
                img_shapes=shapes,
                return_dict=False,
            )[0]
            return batch.own_tokens(list(predictions))
        predictions = packed.forward(self.transformer, layout, torch.cat(rows)[None], timestep, self._text(batch))
        return batch.own_tokens(layout.image.split(predictions[0]))

    @torch.inference_mode()
    def forward_cached(
        self, batch: ForwardBatch, samples: Sequence[CachedSample], *, may_gather: bool
    ) -> CachedForward:
        """First-Block Cache: the first block runs on every row and its residual on the image stream decides
        (`step_cache_rows`); the other blocks run on the rows that compute, packed on their own."""
        model = self.transformer
        rows, layout, _, timestep = self._inputs(batch)
        image, text, temb = packed.embed(model, layout, torch.cat(rows)[None], timestep, self._text(batch))
        first, first_text = packed.run_blocks(model.transformer_blocks[:1], image, text, temb, layout)
        rest = model.transformer_blocks[1:]

        def run_rest(computing: Sequence[int] | None, part: torch.Tensor) -> torch.Tensor:
            if computing is None:
                return packed.run_blocks(rest, part, first_text, temb, layout)[0]
            part_text = first_text[:, layout.text.token_index(computing)]
            part_temb = temb[layout.modulation_rows(computing)]
            return packed.run_blocks(rest, part, part_text, part_temb, layout.select(computing))[0]

        features = first_block_features(image, first, layout.image)
        out, skipped = cached_blocks(samples, features, first, layout.image, run_rest, may_gather=may_gather)
        predictions = packed.output(model, layout, out, temb)  # [1, image tokens, 64]
        return CachedForward(batch.own_tokens(layout.image.split(predictions[0])), skipped)

    def _inputs(self, batch: ForwardBatch) -> tuple[list[torch.Tensor], QwenLayout, list[ImageShapes], torch.Tensor]:
        """Each row's image-stream tokens [tokens_i, 64], the rows' layout and `img_shapes`, and their timesteps
        in [0, 1]; counts the forward's positions."""
        rows = self.image_tokens(list(batch.latents), batch)
        layout, shapes = self._layout(batch)
        text_lengths = batch.row_lengths("embeds")
        batch.count_positions([text + image for text, image in zip(text_lengths, layout.image.lengths)])
        return rows, layout, shapes, batch.timesteps.to(rows[0].dtype) / 1000

    def _text(self, batch: ForwardBatch) -> torch.Tensor:
        """[1, text tokens, dim]: every row's prompt states, packed."""
        embeds = batch.conditioning["embeds"]  # [rows, longest prompt, dim], zero-padded
        return torch.cat([row[:length] for row, length in zip(embeds, batch.row_lengths("embeds"))])[None]

    def _layout(self, batch: ForwardBatch) -> tuple[QwenLayout, list[ImageShapes]]:
        """The rows' packed layout and their `img_shapes` (each row's own image, then its edit images)."""

        def build() -> tuple[QwenLayout, list[ImageShapes]]:
            rows = zip(batch.conditioning["image_shapes"], batch.row_lengths("image_shapes"))  # [rows, most, 3]
            shapes: list[ImageShapes] = [
                [(int(f), int(h), int(w)) for f, h, w in row[:length].tolist()] for row, length in rows
            ]
            lengths = batch.row_lengths("embeds")
            return packed.build_layout(self.transformer, shapes, lengths, self.device), shapes

        return self.layouts.get(batch.membership or None, build)

    def image_tokens(self, latents: list[torch.Tensor], batch: ForwardBatch) -> list[torch.Tensor]:
        """Each row's image-stream tokens: its latents (an edit row adds its edit image's latents)."""
        return latents

    def guided_prediction(self, rows: torch.Tensor, params: GenerationParams, timestep: torch.Tensor) -> torch.Tensor:
        """The base's CFG, rescaled to the conditional prediction's norm per token, as the pipeline does."""
        combined = super().guided_prediction(rows, params, timestep)
        if len(rows) == 1:
            return combined
        cond = rows[0:1]
        return combined * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))

    def _image_shapes(self, params: GenerationParams) -> torch.Tensor:
        """[1, 3]: the (frames, height, width) in patches of the row's image tokens, as `img_shapes` lists them."""
        return torch.tensor([[1, *self.token_grid(params)]])
