"""Attention per segment over packed rows (`batching.pipelines.packing`): each row attends to its own tokens only.

`attend` takes packed queries, keys and values [tokens, heads, head_dim] and the segments of each.
On CUDA in half precision it runs FlashAttention's varlen kernel (`torch.nn.attention.varlen.varlen_attn`,
one launch for every row, with the segments' `cu_seqlens`); elsewhere (the CPU, float32) it runs
PyTorch's SDPA once per row on that row's slice, or once over all rows when they are equally long.
Either way no padding position exists and no mask is built.

`joint_attention` is an MMDiT block's attention (FLUX.1, FLUX.2, SD3, Qwen-Image: a text stream and an
image stream projected apart, attended as one sequence per row) and `self_attention` a single-stream
one (FLUX.1's single blocks, SD3.5's second attention, Z-Image), each as diffusers' processor computes
it, over packed tokens. A family passes its rotary embedding as a function over a packed stream's
queries and keys (each row's own positions, packed like its tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from batching.pipelines.packing import Joint, Segments

Rotate = Callable[[torch.Tensor], torch.Tensor]  # packed [tokens, heads, head_dim] -> the same, each token rotated
# by its own row's position

VARLEN_DTYPES = (torch.float16, torch.bfloat16)
VARLEN_MAX_HEAD_DIM = 256


def attention_kernel(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """ "varlen" where FlashAttention's varlen kernel applies (CUDA, half precision, a head size it takes, and a
    torch that ships `torch.nn.attention.varlen`); "sdpa" (per row) elsewhere."""
    if device.type != "cuda" or dtype not in VARLEN_DTYPES or head_dim % 8 or head_dim > VARLEN_MAX_HEAD_DIM:
        return "sdpa"
    try:
        import torch.nn.attention.varlen  # noqa: F401  # torch 2.10 and later
    except ImportError:
        return "sdpa"
    return "varlen"


def attend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, query_rows: Segments, key_rows: Segments
) -> torch.Tensor:
    """Packed [tokens, heads, head_dim] queries, keys and values -> each query's attention over its own row's keys,
    [query tokens, heads, head_dim]."""
    if attention_kernel(query.device, query.dtype, query.shape[-1]) == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        query, key, value = (t.contiguous() for t in (query, key, value))  # FLUX.2's fused projection gives views
        out = varlen_attn(
            query, key, value, query_rows.cu_seqlens, key_rows.cu_seqlens, query_rows.max_length, key_rows.max_length
        )
        return cast(torch.Tensor, out)  # no auxiliary output asked for
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if query_rows.is_uniform and key_rows.is_uniform:  # one batch of equal rows: [rows, heads, tokens, head_dim]
        rows_query, rows_key, rows_value = (
            t.unflatten(0, (query_rows.num_rows, -1)).transpose(1, 2) for t in (query, key, value)
        )
        return sdpa(rows_query, rows_key, rows_value).transpose(1, 2).flatten(0, 1)
    outputs = []
    for row_query, row_key, row_value in zip(query_rows.split(query), key_rows.split(key), key_rows.split(value)):
        # [1, heads, tokens, head_dim] views, as diffusers' native attention lays out one row
        heads_query, heads_key, heads_value = (t[None].transpose(1, 2) for t in (row_query, row_key, row_value))
        outputs.append(sdpa(heads_query, heads_key, heads_value).transpose(1, 2)[0])
    return torch.cat(outputs)


def joint_attention(
    attn: Any,
    image: torch.Tensor,
    text: torch.Tensor,
    joint: Joint,
    rotate: Rotate | None = None,
    *,
    text_first: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An MMDiT attention module over packed image tokens [1, image tokens, dim] and text tokens (packed [1, text
    tokens, dim], or [rows, tokens, dim] where every row has as many). `joint` joins the two streams per row in
    the family's order ([text | image], or SD3's [image | text]); `rotate` rotates the joint queries and keys.
    Returns (image output [1, image tokens, dim], text output shaped as `text`, or None where the module keeps no
    text output projection: SD3's last block)."""
    text_rows, image_rows = joint.streams if text_first else joint.streams[::-1]
    with image_rows.lora_tokens():
        image_q, image_k, image_v = _heads(attn, image, attn.to_q, attn.to_k, attn.to_v)
    with text_rows.lora_tokens():
        text_q, text_k, text_v = _heads(attn, text, attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
    image_q, image_k = _normed(attn.norm_q, image_q), _normed(attn.norm_k, image_k)
    text_q, text_k = _normed(attn.norm_added_q, text_q), _normed(attn.norm_added_k, text_k)
    streams = [(text_q, image_q), (text_k, image_k), (text_v, image_v)]
    query, key, value = (joint.join(*(pair if text_first else pair[::-1])) for pair in streams)
    if rotate is not None:
        query, key = rotate(query), rotate(key)
    out = attend(query, key, value, joint.segments, joint.segments).flatten(1).to(query.dtype)  # [tokens, dim]
    parts = joint.unjoin(out)
    text_out, image_out = parts if text_first else parts[::-1]
    with image_rows.lora_tokens():
        image_out = _project_out(attn, image_out[None])
    if getattr(attn, "context_pre_only", False) or getattr(attn, "to_add_out", None) is None:
        return image_out, None
    with text_rows.lora_tokens():
        return image_out, attn.to_add_out(text_out.view(*text.shape[:-1], -1))


def self_attention(attn: Any, hidden: torch.Tensor, rows: Segments, rotate: Rotate | None = None) -> torch.Tensor:
    """A single-stream attention module (queries, keys and values of one packed stream, heads normed after the
    split) over [1, tokens, dim]: [1, tokens, dim], through the module's output projection where it has one."""
    with rows.lora_tokens():
        query, key, value = _heads(attn, hidden, attn.to_q, attn.to_k, attn.to_v)
    query, key = _normed(attn.norm_q, query), _normed(attn.norm_k, key)
    if rotate is not None:
        query, key = rotate(query), rotate(key)
    out = attend(query, key, value, rows, rows).flatten(1).to(query.dtype)[None]
    if getattr(attn, "to_out", None) is None:  # FLUX.1's single blocks project after joining the MLP
        return out
    with rows.lora_tokens():
        return _project_out(attn, out)


def rotate_complex(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as complex multiplication (Z-Image's, Qwen-Image's): packed [tokens, heads, head_dim] by
    each token's frequencies [tokens, head_dim / 2] (complex)."""
    rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)) * freqs[:, None]
    return torch.view_as_real(rotated).flatten(-2).type_as(x)


def _heads(attn: Any, hidden: torch.Tensor, *projections: Any) -> list[torch.Tensor]:
    """Each projection of `hidden` ([1, tokens, dim] packed, or [rows, tokens, dim]) split into heads and packed:
    [tokens, heads, head_dim]."""
    return [projection(hidden).unflatten(-1, (attn.heads, -1)).flatten(0, 1) for projection in projections]


def _normed(norm: Any, tensor: torch.Tensor) -> torch.Tensor:
    return tensor if norm is None else norm(tensor)


def _project_out(attn: Any, out: torch.Tensor) -> torch.Tensor:
    for layer in attn.to_out:  # the output projection, then its dropout
        out = layer(out)
    return out
