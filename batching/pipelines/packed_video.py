"""A video transformer (`WanTransformer3DModel` and the video DiTs built like it) over rows of any shape.

Rows of one shape (latent frames, height, width) go through diffusers' own forward as one batch
(`run_uniform`). Rows of different shapes and frame counts cannot: that forward takes one
[rows, channels, frames, height, width] tensor, and its rotary table is computed from that one
shape. `run_packed` runs the model's own modules over them, packed (`batching.pipelines.packing`):
each row is patch-embedded alone and given its own rotary table (the transformer's `rope` of the
row's shape), its tokens join one sequence, the self-attention runs per row and the
cross-attention reads each row's own prompt (and image) tokens, norms and the MLP work per token,
and each row's timestep modulation is laid over its own tokens. Each row's prediction is
unpatchified from its own tokens. A family of this architecture (Wan; the next video family built
the same way) calls these and keeps only what is its own (experts, first-frame conditioning).
`run_cached` is `run_packed` with the step cache (TeaCache's feature, as Z-Image's).

Per-token timesteps (Wan 2.2 TI2V-5B's `expand_timesteps`) give every token of a row its row's
timestep in the pipelines this serves, so a row's modulation is the same over its tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from batching.pipelines.contract import CachedSample
from batching.pipelines.packed_attention import attend
from batching.pipelines.packing import Segments
from batching.pipelines.step_cache_rows import cached_blocks

TEXT_CONTEXT = 512  # the text tokens at the end of a row's context (an image-to-video row's image tokens come first)


@dataclass(eq=False)
class VideoLayout:
    """One forward's rows of video tokens: their patch grids, segments and rotary tables."""

    grids: list[tuple[int, int, int]]  # per row (frames, height, width) in patches
    video: Segments
    cos: torch.Tensor  # [tokens, 1, head_dim]: each token's row's rotary table
    sin: torch.Tensor
    _contexts: dict[int, Segments] = field(default_factory=dict)
    _selections: dict[tuple[int, ...], VideoLayout] = field(default_factory=dict)

    def context(self, num_tokens: int) -> Segments:
        """The segments of every row's `num_tokens` context tokens (kept: building them copies to the device)."""
        if num_tokens not in self._contexts:
            self._contexts[num_tokens] = Segments((num_tokens,) * self.video.num_rows, self.video.device)
        return self._contexts[num_tokens]

    def select(self, rows: Sequence[int]) -> VideoLayout:
        """The layout of `rows` alone (a step cache's rows that compute), kept per row set."""
        key = tuple(rows)
        if key not in self._selections:
            video, index = self.video.select(key)
            grids = [self.grids[row] for row in key]
            self._selections[key] = VideoLayout(
                grids, video, self.cos.index_select(0, index), self.sin.index_select(0, index)
            )
        return self._selections[key]


def build_layout(transformer: Any, shapes: Sequence[torch.Size]) -> VideoLayout:
    """The layout of rows of `shapes` ([c, frames, h, w] each), with the transformer's own rotary table per row."""
    p_t, p_h, p_w = transformer.config.patch_size
    device = transformer.device
    grids, cos, sin = [], [], []
    for shape in shapes:
        row_cos, row_sin = transformer.rope(torch.empty(1, *shape, device="meta"))  # [1, tokens, 1, head_dim]
        cos.append(row_cos[0])
        sin.append(row_sin[0])
        grids.append((shape[1] // p_t, shape[2] // p_h, shape[3] // p_w))
    video = Segments(tuple(f * h * w for f, h, w in grids), device)
    return VideoLayout(grids, video, torch.cat(cos).to(device), torch.cat(sin).to(device))


def run_uniform(
    transformer: Any,
    hidden: torch.Tensor,
    timestep: torch.Tensor,
    embeds: torch.Tensor,
    image_embeds: torch.Tensor | None,
) -> torch.Tensor:
    """diffusers' forward over rows of one shape: hidden [rows, c_in, f, h, w], timestep [rows] (or
    [rows, tokens] per token), embeds [rows, 512, text_dim] -> [rows, c_out, f, h, w]."""
    return transformer(
        hidden_states=hidden,
        timestep=timestep,
        encoder_hidden_states=embeds,
        encoder_hidden_states_image=image_embeds,
        return_dict=False,
    )[0]


def run_packed(
    transformer: Any,
    layout: VideoLayout,
    rows: Sequence[torch.Tensor],
    timestep: torch.Tensor,
    embeds: torch.Tensor,
    image_embeds: torch.Tensor | None,
) -> list[torch.Tensor]:
    """The forward over rows of any shapes, each [c_in, f, h, w]; `timestep` [rows], embeds [rows, 512,
    text_dim], image_embeds [rows, image tokens, image_dim] or None. Each row's prediction [c_out, f, h, w]."""
    state = embed(transformer, rows, timestep, embeds, image_embeds)
    hidden = run_blocks(transformer.blocks, state.hidden, state.context, state.modulation, layout)
    return output(transformer, layout, hidden, state.temb)


def run_cached(
    transformer: Any,
    layout: VideoLayout,
    rows: Sequence[torch.Tensor],
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],  # run_packed's timestep, embeds, image_embeds
    samples: Sequence[CachedSample],
    *,
    may_gather: bool,
) -> tuple[list[torch.Tensor], list[bool]]:
    """`run_packed` with the step cache (`step_cache_rows.cached_blocks`): the early feature is TeaCache's, the
    first block's timestep-modulated input, and a skip saves every block. Each row's prediction and which samples
    skipped."""
    model = transformer
    state = embed(model, rows, *inputs)
    shift_msa, scale_msa = _modulation(model.blocks[0], state.modulation, layout)[:2]
    modulated = model.blocks[0].norm1(state.hidden.float()) * (1 + scale_msa) + shift_msa  # [1, tokens, dim]
    features = layout.video.split(modulated[0])

    def run(computing: Sequence[int] | None, hidden: torch.Tensor) -> torch.Tensor:
        if computing is None:
            return run_blocks(model.blocks, hidden, state.context, state.modulation, layout)
        part = layout.select(computing)
        return run_blocks(model.blocks, hidden, state.context[computing], state.modulation[computing], part)

    hidden, skipped = cached_blocks(samples, features, state.hidden, layout.video, run, may_gather=may_gather)
    return output(model, layout, hidden, state.temb), skipped


@dataclass
class Embedded:
    hidden: torch.Tensor  # [1, tokens, dim]: every row's patch tokens, packed
    context: torch.Tensor  # [rows, context tokens, dim]: an image-to-video row's image tokens, then its text's
    modulation: torch.Tensor  # [rows, 6, dim]: each row's timestep projection, which every block modulates with
    temb: torch.Tensor  # [rows, dim]: each row's timestep embedding (the output norm's)


def embed(
    transformer: Any,
    rows: Sequence[torch.Tensor],
    timestep: torch.Tensor,
    embeds: torch.Tensor,
    image_embeds: torch.Tensor | None,
) -> Embedded:
    model = transformer
    hidden = torch.cat([model.patch_embedding(row[None]).flatten(2).transpose(1, 2)[0] for row in rows])[None]
    temb, timestep_proj, text, image = model.condition_embedder(timestep, embeds, image_embeds)
    context = text if image is None else torch.cat([image, text], dim=1)
    return Embedded(hidden, context, timestep_proj.unflatten(1, (6, -1)), temb)


def run_blocks(
    blocks: Sequence[Any], hidden: torch.Tensor, context: torch.Tensor, modulation: torch.Tensor, layout: VideoLayout
) -> torch.Tensor:
    """`blocks` over the packed rows [1, tokens, dim]: the tokens after them."""
    for block in blocks:
        hidden = _block(block, hidden, context, modulation, layout)
    return hidden


def output(transformer: Any, layout: VideoLayout, hidden: torch.Tensor, temb: torch.Tensor) -> list[torch.Tensor]:
    """Each row's prediction [c_out, f, h, w] from the tokens after the last block."""
    model = transformer
    shift, scale = (model.scale_shift_table.to(temb.device) + temb.unsqueeze(1)).chunk(2, dim=1)  # [rows, 1, dim]
    shift, scale = (layout.video.per_token(values[:, 0])[None] for values in (shift, scale))
    hidden = (model.norm_out(hidden.float()) * (1 + scale) + shift).type_as(hidden)
    out = model.proj_out(hidden)[0]  # [tokens, c_out * p_t * p_h * p_w]
    p_t, p_h, p_w = model.config.patch_size
    predictions = []
    for own, (frames, height, width) in zip(layout.video.split(out), layout.grids):
        grid = own.reshape(1, frames, height, width, p_t, p_h, p_w, -1)
        predictions.append(grid.permute(0, 7, 1, 4, 2, 5, 3, 6).flatten(6, 7).flatten(4, 5).flatten(2, 3)[0])
    return predictions


def _modulation(block: Any, modulation: torch.Tensor, layout: VideoLayout) -> list[torch.Tensor]:
    """The block's six modulations (shift, scale and gate of its self-attention, then of its MLP), each row's
    laid over its tokens: each [1, tokens, dim] float32."""
    per_row = (block.scale_shift_table + modulation.float()).chunk(6, dim=1)  # each [rows, 1, dim]
    return [layout.video.per_token(values[:, 0])[None] for values in per_row]


def _block(
    block: Any, hidden: torch.Tensor, context: torch.Tensor, modulation: torch.Tensor, layout: VideoLayout
) -> torch.Tensor:
    """`WanTransformerBlock.forward` over packed [1, tokens, dim], each row's modulation [rows, 6, dim] laid over
    its tokens."""
    shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = _modulation(block, modulation, layout)
    normed = (block.norm1(hidden.float()) * (1 + scale_msa) + shift_msa).type_as(hidden)
    hidden = (hidden.float() + _self_attention(block.attn1, normed, layout) * gate_msa).type_as(hidden)
    normed = block.norm2(hidden.float()).type_as(hidden)
    hidden = hidden + _cross_attention(block.attn2, normed, context, layout)
    normed = (block.norm3(hidden.float()) * (1 + c_scale_msa) + c_shift_msa).type_as(hidden)
    return (hidden.float() + block.ffn(normed).float() * c_gate_msa).type_as(hidden)


def _self_attention(attn: Any, hidden: torch.Tensor, layout: VideoLayout) -> torch.Tensor:
    """`WanAttnProcessor` over one packed stream, each row attending to itself, rotated by its own positions."""
    query, key, value = attn.norm_q(attn.to_q(hidden)), attn.norm_k(attn.to_k(hidden)), attn.to_v(hidden)
    query, key, value = (t[0].unflatten(-1, (attn.heads, -1)) for t in (query, key, value))  # [tokens, heads, dim]
    query, key = _rotate(query, layout.cos, layout.sin), _rotate(key, layout.cos, layout.sin)
    out = attend(query, key, value, layout.video, layout.video).flatten(1).type_as(query)
    return attn.to_out[1](attn.to_out[0](out))[None]


def _cross_attention(attn: Any, hidden: torch.Tensor, context: torch.Tensor, layout: VideoLayout) -> torch.Tensor:
    """`WanAttnProcessor` as a cross-attention: each row's packed tokens attend to its own context tokens
    ([rows, context tokens, dim]: an image-to-video model's image tokens, then the 512 text tokens)."""
    image_context = None
    if attn.add_k_proj is not None:
        image_context, context = context[:, : context.shape[1] - TEXT_CONTEXT], context[:, -TEXT_CONTEXT:]
    query = attn.norm_q(attn.to_q(hidden))[0].unflatten(-1, (attn.heads, -1))  # [tokens, heads, dim]
    out = _attend_context(query, attn.norm_k(attn.to_k(context)), attn.to_v(context), layout, attn.heads)
    if image_context is not None:
        key = attn.norm_added_k(attn.add_k_proj(image_context))
        out = out + _attend_context(query, key, attn.add_v_proj(image_context), layout, attn.heads)
    return attn.to_out[1](attn.to_out[0](out))[None]


def _attend_context(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: VideoLayout, num_heads: int
) -> torch.Tensor:
    """Packed queries [tokens, heads, dim] against each row's own keys and values [rows, context tokens, dim]:
    [tokens, heads * dim] in the queries' dtype."""
    context_rows = layout.context(key.shape[1])
    key, value = (t.flatten(0, 1).unflatten(-1, (num_heads, -1)) for t in (key, value))
    return attend(query, key, value, layout.video, context_rows).flatten(1).type_as(query)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary embedding (real and imaginary parts interleaved) of packed [tokens, heads, head_dim]."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)
