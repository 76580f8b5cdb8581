"""One Wan transformer (an expert) over rows of a group, as `WanTransformer3DModel.forward` runs them.

Rows of one shape (latent frames, height, width) go through diffusers' own forward as one batch.
Rows of different shapes cannot: that forward takes one [rows, channels, frames, height, width]
tensor, and its rotary embedding is computed from that one shape (as Qwen-Image's was from its
first row's). `run_mixed` runs the same modules over them (`batching.pipelines.mixed_sizes`): each
row is patch-embedded and given its own rotary tables (the transformer's own `rope` of the row's
shape), its tokens are zero-padded to the longest row's, and every block's self-attention masks
the padding keys; the cross-attention reads the prompt (and image) tokens every row has alike, and
norms, MLPs and timestep modulation work per token, so a row's real tokens compute what they would
alone. Each row's prediction is unpatchified from its own tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batching.pipelines.mixed_sizes import RowAttention, RowLayout, pad_rows, padding_mask


class MaskedSelfAttention:
    """Wan's self-attention (diffusers' `WanAttnProcessor`) with the padding keys of the layout under way masked;
    the rotary tables are the block's `rotary_emb` argument, one per row in a mixed forward."""

    def __init__(self, row_attention: RowAttention) -> None:
        from diffusers.models.transformers.transformer_wan import WanAttnProcessor

        self.row_attention = row_attention
        self.uniform = WanAttnProcessor()

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        layout = self.row_attention.layout
        if layout is not None:
            attention_mask = layout.key_mask  # [rows, tokens]: True where the key is a real token
        return self.uniform(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)


def install(transformer: Any) -> RowAttention:
    """Masked self-attention on every block of a Wan transformer; `rows(layout)` activates it."""
    row_attention = RowAttention()
    for block in transformer.blocks:
        block.attn1.set_processor(MaskedSelfAttention(row_attention))
    return row_attention


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


def run_mixed(
    transformer: Any,
    row_attention: RowAttention,
    rows: Sequence[torch.Tensor],
    timestep: torch.Tensor,
    embeds: torch.Tensor,
    image_embeds: torch.Tensor | None,
) -> list[torch.Tensor]:
    """The forward over rows of different shapes, each [c_in, f, h, w]; `timestep` [rows], or [rows, padded
    tokens] per token (padding tokens' anything). Each row's prediction [c_out, f, h, w]."""
    p_t, p_h, p_w = transformer.config.patch_size
    tokens, cos, sin, grids = [], [], [], []
    for row in rows:
        row_cos, row_sin = transformer.rope(row[None])  # [1, tokens, 1, head_dim] each
        cos.append(row_cos[0])
        sin.append(row_sin[0])
        tokens.append(transformer.patch_embedding(row[None]).flatten(2).transpose(1, 2)[0])  # [tokens, dim]
        grids.append((row.shape[1] // p_t, row.shape[2] // p_h, row.shape[3] // p_w))
    hidden, lengths = pad_rows(tokens)  # [rows, most tokens, dim]
    num_padded = hidden.shape[1]
    rotary = (_padded(cos, num_padded, 1.0), _padded(sin, num_padded, 0.0))  # padding: no rotation (masked anyway)
    per_token = timestep.ndim == 2
    temb, timestep_proj, text, image = transformer.condition_embedder(
        timestep.flatten() if per_token else timestep,
        embeds,
        image_embeds,
        timestep_seq_len=num_padded if per_token else None,
    )
    timestep_proj = timestep_proj.unflatten(2 if per_token else 1, (6, -1))
    context = text if image is None else torch.concat([image, text], dim=1)
    with row_attention.rows(RowLayout(padding_mask(lengths, num_padded, hidden.device))):
        for block in transformer.blocks:
            hidden = block(hidden, context, timestep_proj, rotary)
    table = transformer.scale_shift_table.to(temb.device)
    if temb.ndim == 3:  # per-token timesteps
        shift, scale = (table.unsqueeze(0) + temb.unsqueeze(2)).chunk(2, dim=2)
        shift, scale = shift.squeeze(2), scale.squeeze(2)
    else:
        shift, scale = (table + temb.unsqueeze(1)).chunk(2, dim=1)
    hidden = (transformer.norm_out(hidden.float()) * (1 + scale) + shift).type_as(hidden)
    hidden = transformer.proj_out(hidden)  # [rows, most tokens, c_out * p_t * p_h * p_w]
    outputs = []
    for index, (frames, height, width) in enumerate(grids):
        own = hidden[index, : frames * height * width].reshape(1, frames, height, width, p_t, p_h, p_w, -1)
        outputs.append(own.permute(0, 7, 1, 4, 2, 5, 3, 6).flatten(6, 7).flatten(4, 5).flatten(2, 3)[0])
    return outputs


def _padded(tables: list[torch.Tensor], length: int, value: float) -> torch.Tensor:
    """Rows' rotary tables [tokens_i, 1, head_dim] padded with `value` to [rows, length, 1, head_dim]."""
    return torch.stack(
        [torch.cat([table, table.new_full((length - len(table), *table.shape[1:]), value)]) for table in tables]
    )
