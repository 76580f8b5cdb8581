"""FLUX.1 rows of different sizes in one forward (`batching.pipelines.mixed_sizes`).

`FluxTransformer2DModel` takes one position-id table for the whole batch. Each row's image
tokens are zero-padded to the group's longest; every attention module (double-stream blocks:
text tokens first; single-stream blocks: the text already joined) rotates each row by its own
ids and masks the padding keys. FLUX.2 shares the rotary layout (interleaved real and imaginary
pairs; its ids have four axes), so it builds its layouts and position ids here too.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from batching.pipelines.mixed_sizes import RowAttention, RowLayout, install_joint_attention, padding_mask


def install(transformer: Any) -> RowAttention:
    """Mixed-size processors on every attention module of a FLUX.1 transformer; `rows(layout)` activates them."""
    # Imported here, not at module load: diffusers' FLUX module loads accelerate, and with it boto3
    # (tests/test_layering.py keeps batching modules from loading that when imported).
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    return install_joint_attention(transformer, FluxAttnProcessor())


def row_layout(transformer: Any, text_ids: torch.Tensor, image_ids: torch.Tensor, num_image_tokens: list[int]):
    """The layout over [text tokens | image tokens] of rows whose image ids [rows, max tokens, axes] are
    zero-padded after `num_image_tokens`, each rotated by the transformer's own embedding of its ids."""
    tables = [transformer.pos_embed(torch.cat([text_ids, ids])) for ids in image_ids]  # per row (cos, sin)
    cos = torch.stack([row_cos for row_cos, _ in tables])[:, :, None]  # [rows, tokens, 1, head_dim]
    sin = torch.stack([row_sin for _, row_sin in tables])[:, :, None]
    text_keys = torch.ones(len(num_image_tokens), text_ids.shape[0], dtype=torch.bool, device=image_ids.device)
    image_keys = padding_mask(num_image_tokens, image_ids.shape[1], image_ids.device)
    return RowLayout(torch.cat([text_keys, image_keys], dim=1), functools.partial(rotate, cos=cos, sin=sin))


def position_ids(time: int, height: int, width: int, *length: int) -> torch.Tensor:
    """[height * width (* length), axes] float32 position ids (time, row, column[, index]) of a grid of tokens,
    row-major as the FLUX pipelines build them (FLUX.2's have the fourth axis)."""
    axes = (torch.tensor([time]), torch.arange(height), torch.arange(width), *(torch.arange(n) for n in length))
    return torch.cartesian_prod(*axes).float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding with interleaved real/imaginary pairs (FLUX's layout), a table per row."""
    real, imaginary = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    rotated = torch.stack([-imaginary, real], dim=-1).flatten(3)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)
