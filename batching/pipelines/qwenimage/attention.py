"""Qwen-Image rows of different image shapes in one forward (`batching.pipelines.mixed_sizes`).

`QwenImageTransformer2DModel` takes per-row `img_shapes`, but its rotary embedding uses the first
row's for every row (diffusers warns that variable sizes are unsupported), and the text tokens'
positions start after the largest image side, so they too depend on the row's image. Each row's
image tokens (an edit row's: its own, then its edit image's) are zero-padded to the group's
longest, as are its prompt's tokens; every block's joint attention ([text | image]) rotates each
row by its own positions (complex rotary, as `apply_rotary_emb_qwen`) and masks the padding keys
of both streams.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from batching.pipelines.mixed_sizes import RowAttention, RowLayout, install_joint_attention, padding_mask

ImageShapes = list[tuple[int, int, int]]  # one row's (frames, height, width) in latent patches, as img_shapes


def install(transformer: Any) -> RowAttention:
    """Mixed-shape processors on every block of a Qwen-Image transformer; `rows(layout)` activates them."""
    from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

    return install_joint_attention(transformer, QwenDoubleStreamAttnProcessor2_0())


def row_layout(
    transformer: Any, image_shapes: Sequence[ImageShapes], num_image_tokens: Sequence[int], text_lengths: Sequence[int]
) -> RowLayout:
    """The layout of rows whose image tokens (padded to the longest) have `image_shapes`, and whose text tokens
    (padded to the longest) number `text_lengths`; positions from the transformer's own rotary embedding."""
    device = transformer.device
    max_text, max_image = max(text_lengths), max(num_image_tokens)
    rows = []
    for shapes in image_shapes:
        image_freqs, text_freqs = transformer.pos_embed([shapes], device=device, max_txt_seq_len=max_text)
        padding = image_freqs.new_ones(max_image - image_freqs.shape[0], image_freqs.shape[1])  # padding keys: masked
        rows.append(torch.cat([text_freqs, image_freqs, padding]))  # [text + image tokens, head_dim / 2] complex
    key_mask = torch.cat(
        [padding_mask(text_lengths, max_text, device), padding_mask(num_image_tokens, max_image, device)], dim=1
    )
    return RowLayout(key_mask, functools.partial(rotate, freqs=torch.stack(rows)[:, :, None]))


def rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Qwen-Image's complex rotary embedding (`apply_rotary_emb_qwen`, use_real=False), a table per row."""
    rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)) * freqs
    return torch.view_as_real(rotated).flatten(3).type_as(x)
