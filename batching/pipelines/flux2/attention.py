"""FLUX.2 rows of different token counts in one forward: padded image tokens, per-row positions, key masks.

`Flux2Transformer2DModel` takes one position-id table for the whole batch and attends
over every token of a row, as FLUX.1's does (`flux.attention`, whose `RowLayout` this
reuses: FLUX.2's rotary embedding has the same interleaved layout, over four axes). A
FLUX.2 row's image tokens are its noise latents followed by its reference images' latents,
so rows differ in length when their sizes or their references differ. Each row's tokens
are zero-padded to the group's longest; while a layout is active, the two processors
here (one for the double-stream blocks' joint attention, one for the single-stream
blocks' fused attention and MLP) apply each row's own rotary embedding and mask the
padding keys. Everything else in the model is per token or per row (norms, MLPs,
modulation), so a real token's output does not depend on the padding. Without a layout
(uniform groups) the processors are diffusers' own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from batching.pipelines.flux.attention import RowLayout, rotate


class Flux2RowAttention:
    """Installs the mixed-size processors on a FLUX.2 transformer; `rows(layout)` activates them for a forward."""

    def __init__(self, transformer: Any) -> None:
        # Imported here, not at module load: diffusers' transformer modules load accelerate, and with it boto3.
        from diffusers.models.transformers.transformer_flux2 import Flux2Attention, Flux2ParallelSelfAttention

        self.layout: RowLayout | None = None
        joint: Any = _JointAttention(self)  # duck-typed processors: diffusers' annotation lists its own classes
        fused: Any = _FusedAttention(self)
        for module in transformer.modules():
            if isinstance(module, Flux2Attention):
                module.set_processor(joint)
            elif isinstance(module, Flux2ParallelSelfAttention):
                module.set_processor(fused)

    @contextlib.contextmanager
    def rows(self, layout: RowLayout) -> Iterator[None]:
        self.layout = layout
        try:
            yield
        finally:
            self.layout = None


class _JointAttention:
    """The double-stream blocks' attention: text and image streams projected apart, attended jointly."""

    def __init__(self, rows: Flux2RowAttention) -> None:
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_flux2 import Flux2AttnProcessor, _get_qkv_projections

        self.row_attention = rows
        self.uniform = Flux2AttnProcessor()
        self._projections = _get_qkv_projections
        self._attention = dispatch_attention_fn

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        layout = self.row_attention.layout
        if layout is None:
            return self.uniform(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        query, key, value, text_query, text_key, text_value = self._projections(
            attn, hidden_states, encoder_hidden_states
        )
        query, key, value = (tensor.unflatten(-1, (-1, attn.head_dim)) for tensor in (query, key, value))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if attn.added_kv_proj_dim is not None:  # text tokens go first
            text_query, text_key, text_value = (
                tensor.unflatten(-1, (-1, attn.head_dim)) for tensor in (text_query, text_key, text_value)
            )
            query = torch.cat([attn.norm_added_q(text_query), query], dim=1)
            key = torch.cat([attn.norm_added_k(text_key), key], dim=1)
            value = torch.cat([text_value, value], dim=1)
        query, key = rotate(query, layout), rotate(key, layout)
        out = self._attention(query, key, value, attn_mask=layout.key_mask, backend=self.uniform._attention_backend)
        out = out.flatten(2, 3).to(query.dtype)
        num_text = encoder_hidden_states.shape[1]
        text_out, out = out[:, :num_text], out[:, num_text:]
        out = attn.to_out[1](attn.to_out[0](out))
        return out, attn.to_add_out(text_out)


class _FusedAttention:
    """The single-stream blocks': one projection gives queries, keys, values and the MLP's input."""

    def __init__(self, rows: Flux2RowAttention) -> None:
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_flux2 import Flux2ParallelSelfAttnProcessor

        self.row_attention = rows
        self.uniform = Flux2ParallelSelfAttnProcessor()
        self._attention = dispatch_attention_fn

    def __call__(self, attn, hidden_states, attention_mask=None, image_rotary_emb=None):
        layout = self.row_attention.layout
        if layout is None:
            return self.uniform(attn, hidden_states, attention_mask, image_rotary_emb)
        projected = attn.to_qkv_mlp_proj(hidden_states)
        qkv, mlp = projected.split([3 * attn.inner_dim, attn.mlp_hidden_dim * attn.mlp_mult_factor], dim=-1)
        query, key, value = (tensor.unflatten(-1, (-1, attn.head_dim)) for tensor in qkv.chunk(3, dim=-1))
        query, key = rotate(attn.norm_q(query), layout), rotate(attn.norm_k(key), layout)
        out = self._attention(query, key, value, attn_mask=layout.key_mask, backend=self.uniform._attention_backend)
        out = out.flatten(2, 3).to(query.dtype)
        return attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))
