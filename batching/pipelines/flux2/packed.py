"""`Flux2Transformer2DModel.forward` over packed rows (`batching.pipelines.packing`).

A FLUX.2 row's image tokens are its noise latents followed by its reference images' latents, so rows
differ in length with their sizes and references. They are packed into one sequence (FLUX.1's layout,
`flux.packed.FluxLayout`: its rotary embedding has FLUX.1's interleaved pairs, over four axes); the
text tokens (512 per row) stay a [rows, 512, dim] batch. FLUX.2 computes each row's modulation once
per forward from its timestep and guidance embedding, shared by every block: here it is laid over
the row's tokens once. The calls are the model's own submodules in its forward's order; attention
runs per row (`packed_attention`). The single-stream blocks fuse the attention's and the MLP's input
projections (`_fused_attention`). Split as FLUX.1's forward is (`embed`, `run_blocks`, `output`), for
the same First-Block Cache (`flux.step_cache`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batching.pipelines.flux.packed import Embedded, FluxLayout, attend_and_feed, output, run_single_stream
from batching.pipelines.packed_attention import attend
from batching.pipelines.packing import Segments, modulation

Chunks = tuple[torch.Tensor, ...]  # a modulation's shift, scale and gate (twice for the double-stream blocks)


def embed(
    transformer: Any,
    layout: FluxLayout,
    latents: torch.Tensor,  # [1, image tokens, channels]: every row's noise and reference tokens
    timestep: torch.Tensor,  # [rows], in [0, 1]
    guidance: torch.Tensor | None,  # [rows], or None without a guidance embedder (klein)
    embeds: torch.Tensor,  # [rows, 512, text_dim]
) -> Embedded:
    model = transformer
    dtype = latents.dtype
    temb = model.time_guidance_embed(timestep.to(dtype) * 1000, None if guidance is None else guidance.to(dtype) * 1000)
    with layout.image.lora_tokens():
        return Embedded(model.x_embedder(latents), model.context_embedder(embeds), temb)


def run_blocks(
    transformer: Any, double_blocks: Sequence[Any], single_blocks: Sequence[Any], state: Embedded, layout: FluxLayout
) -> Embedded:
    """The blocks over the packed rows, each row's modulations (of its `state.temb`, shared by every block) laid
    over its tokens once; the state after them (the text as the last double-stream block left it)."""
    model, image, text, temb = transformer, state.image, state.text, state.temb
    if double_blocks:
        image_mod = modulation(model.double_stream_modulation_img(temb), layout.image, 6)
        text_mod = modulation(model.double_stream_modulation_txt(temb), None, 6)
        with layout.image.lora_tokens():
            for block in double_blocks:
                image, text = double_block(block, image, text, image_mod, text_mod, layout)
    if single_blocks:
        single_mod = modulation(model.single_stream_modulation(temb), layout.joint.segments, 3)
        image = run_single_stream(
            single_blocks, image, text, layout, lambda b, x: single_block(b, x, single_mod, layout)
        )
    return Embedded(image, text, temb)


def forward(transformer: Any, layout: FluxLayout, latents: torch.Tensor, **inputs: torch.Tensor | None) -> torch.Tensor:
    """The forward over packed rows (`embed`'s inputs): [1, image tokens, channels] (the references' predictions
    included)."""
    model = transformer
    state = embed(model, layout, latents, **inputs)  # type: ignore[arg-type]
    state = run_blocks(model, model.transformer_blocks, model.single_transformer_blocks, state, layout)
    return output(model, state.image, state.temb, layout)


def double_block(
    block: Any,
    image: torch.Tensor,
    text: torch.Tensor,
    image_mod: Chunks,
    text_mod: Chunks,
    layout: FluxLayout,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`Flux2TransformerBlock.forward`: packed image tokens [1, tokens, dim], text [rows, 512, dim]."""
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = image_mod
    c_shift_msa, c_scale_msa, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = text_mod
    norm_image = (1 + scale_msa) * block.norm1(image) + shift_msa
    norm_text = (1 + c_scale_msa) * block.norm1_context(text) + c_shift_msa
    return attend_and_feed(
        block,
        image,
        text,
        norm_image,
        norm_text,
        (gate_msa, shift_mlp, scale_mlp, gate_mlp),
        (c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp),
        layout,
    )


def single_block(block: Any, joint: torch.Tensor, mod: Chunks, layout: FluxLayout) -> torch.Tensor:
    """`Flux2SingleTransformerBlock.forward` over the joint sequence [1, tokens, dim], packed row by row."""
    shift, scale, gate = mod
    normed = (1 + scale) * block.norm(joint) + shift
    joint = joint + gate * _fused_attention(block.attn, normed, layout.joint.segments, layout)
    if joint.dtype == torch.float16:
        joint = joint.clip(-65504, 65504)
    return joint


def _fused_attention(attn: Any, hidden: torch.Tensor, rows: Segments, layout: FluxLayout) -> torch.Tensor:
    """`Flux2ParallelSelfAttnProcessor`: one projection gives queries, keys, values and the MLP's input."""
    projected = attn.to_qkv_mlp_proj(hidden)[0]  # [tokens, 3 * inner + mlp]
    qkv, mlp = projected.split([3 * attn.inner_dim, projected.shape[-1] - 3 * attn.inner_dim], dim=-1)
    query, key, value = (part.unflatten(-1, (-1, attn.head_dim)) for part in qkv.chunk(3, dim=-1))
    query, key = layout.rotate(attn.norm_q(query)), layout.rotate(attn.norm_k(key))
    out = attend(query, key, value, rows, rows).flatten(1).to(query.dtype)
    return attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))[None]
