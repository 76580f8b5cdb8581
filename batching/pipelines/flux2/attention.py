"""FLUX.2 rows of different token counts in one forward (`batching.pipelines.mixed_sizes`).

A FLUX.2 row's image tokens are its noise latents followed by its reference images' latents, so
rows differ in length when their sizes or their references differ. Its rotary embedding has
FLUX.1's interleaved layout over four axes, so its layouts are FLUX.1's (`flux.attention.row_layout`).
The double-stream blocks' attention is the shared `JointAttention`; the single-stream blocks fuse
attention and MLP in one projection, whose processor is here.
"""

from __future__ import annotations

from typing import Any

import torch

from batching.pipelines.mixed_sizes import JointAttention, RowAttention, masked_attention


def install(transformer: Any) -> RowAttention:
    """Mixed-size processors on every attention module of a FLUX.2 transformer; `rows(layout)` activates them."""
    # Imported here, not at module load: diffusers' transformer modules load accelerate, and with it boto3.
    from diffusers.models.transformers.transformer_flux2 import (
        Flux2Attention,
        Flux2AttnProcessor,
        Flux2ParallelSelfAttention,
    )

    row_attention = RowAttention()
    joint: Any = JointAttention(row_attention, Flux2AttnProcessor())  # Any: diffusers' annotation lists its own
    fused: Any = _FusedAttention(row_attention)
    for module in transformer.modules():
        if isinstance(module, Flux2Attention):
            module.set_processor(joint)
        elif isinstance(module, Flux2ParallelSelfAttention):
            module.set_processor(fused)
    return row_attention


class _FusedAttention:
    """The single-stream blocks': one projection gives queries, keys, values and the MLP's input."""

    def __init__(self, row_attention: RowAttention) -> None:
        from diffusers.models.transformers.transformer_flux2 import Flux2ParallelSelfAttnProcessor

        self.row_attention = row_attention
        self.uniform = Flux2ParallelSelfAttnProcessor()

    def __call__(self, attn, hidden_states, attention_mask=None, image_rotary_emb=None):
        layout = self.row_attention.layout
        if layout is None:
            return self.uniform(attn, hidden_states, attention_mask, image_rotary_emb)
        projected = attn.to_qkv_mlp_proj(hidden_states)
        qkv, mlp = projected.split([3 * attn.inner_dim, attn.mlp_hidden_dim * attn.mlp_mult_factor], dim=-1)
        query, key, value = (tensor.unflatten(-1, (-1, attn.head_dim)) for tensor in qkv.chunk(3, dim=-1))
        query, key = attn.norm_q(query), attn.norm_k(key)
        out = masked_attention(query, key, value, layout.key_mask, layout.rotation, self.uniform._attention_backend)
        return attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))
