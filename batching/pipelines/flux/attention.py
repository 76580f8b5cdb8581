"""FLUX rows of different sizes in one forward: padded image tokens, per-row positions, key masks.

`FluxTransformer2DModel` takes one position-id table for the whole batch (so one size)
and attends over every token of a row. To mix sizes, each row's image tokens are
zero-padded to the group's longest, and `MixedSizeFluxAttnProcessor` (set on every
attention module) applies each row's own rotary embedding and masks the padding keys,
so no token attends to padding and rows never meet (attention is per row anyway).
Everything else in the model is per token or per row (norms, MLPs, modulation), so a
real token's output does not depend on the padding. Without a `RowLayout` (uniform
groups, deterministic mode) the processor is diffusers' own, untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class RowLayout:
    """One mixed-size forward's per-row attention inputs, over [text tokens | padded image tokens]."""

    cos: torch.Tensor  # [rows, text + max image tokens, 1, head_dim] rotary cosines of each row's own positions
    sin: torch.Tensor
    key_mask: torch.Tensor  # [rows, text + max image tokens] bool: True where the key is a real token


class MixedSizeFluxAttnProcessor:
    """FLUX joint attention with per-row rotary positions and a key mask while a `RowLayout` is active."""

    def __init__(self) -> None:
        # Imported here, not at module load: diffusers' FLUX module loads accelerate, and with it boto3
        # (tests/test_layering.py keeps batching modules from loading that when imported).
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, _get_qkv_projections

        self.uniform = FluxAttnProcessor()
        self._projections = _get_qkv_projections
        self._attention = dispatch_attention_fn
        self.layout: RowLayout | None = None

    @contextlib.contextmanager
    def rows(self, layout: RowLayout) -> Iterator[None]:
        self.layout = layout
        try:
            yield
        finally:
            self.layout = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        layout = self.layout
        if layout is None:
            return self.uniform(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        query, key, value, text_query, text_key, text_value = self._projections(
            attn, hidden_states, encoder_hidden_states
        )
        query, key, value = (tensor.unflatten(-1, (-1, attn.head_dim)) for tensor in (query, key, value))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if attn.added_kv_proj_dim is not None:  # double-stream block: text tokens go first
            text_query, text_key, text_value = (
                tensor.unflatten(-1, (-1, attn.head_dim)) for tensor in (text_query, text_key, text_value)
            )
            query = torch.cat([attn.norm_added_q(text_query), query], dim=1)
            key = torch.cat([attn.norm_added_k(text_key), key], dim=1)
            value = torch.cat([text_value, value], dim=1)
        query, key = rotate(query, layout), rotate(key, layout)
        out = self._attention(query, key, value, attn_mask=layout.key_mask, backend=self.uniform._attention_backend)
        out = out.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is None:
            return out
        num_text = encoder_hidden_states.shape[1]
        text_out, out = out[:, :num_text], out[:, num_text:]
        out = attn.to_out[1](attn.to_out[0](out.contiguous()))
        return out, attn.to_add_out(text_out.contiguous())


def rotate(x: torch.Tensor, layout: RowLayout) -> torch.Tensor:
    """Rotary embedding with interleaved real/imaginary pairs (FLUX's layout), a table per row."""
    real, imaginary = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    rotated = torch.stack([-imaginary, real], dim=-1).flatten(3)
    return (x.float() * layout.cos + rotated.float() * layout.sin).to(x.dtype)


def row_layout(transformer, text_ids: torch.Tensor, image_ids: torch.Tensor, num_image_tokens: list[int]) -> RowLayout:
    """The layout of rows whose image ids [rows, max tokens, 3] are zero-padded after `num_image_tokens`."""
    cos_rows, sin_rows = [], []
    for ids in image_ids:
        cos, sin = transformer.pos_embed(torch.cat([text_ids, ids]))
        cos_rows.append(cos)
        sin_rows.append(sin)
    num_text, num_tokens = text_ids.shape[0], image_ids.shape[1]
    positions = torch.arange(num_tokens, device=image_ids.device)
    image_mask = positions[None, :] < torch.tensor(num_image_tokens, device=image_ids.device)[:, None]
    key_mask = torch.cat(
        [torch.ones(len(num_image_tokens), num_text, dtype=torch.bool, device=image_ids.device), image_mask], dim=1
    )
    return RowLayout(torch.stack(cos_rows)[:, :, None], torch.stack(sin_rows)[:, :, None], key_mask)
