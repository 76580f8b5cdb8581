"""SD3 rows of different sizes in one forward: per-row patch positions, padded image tokens, key masks
(`batching.pipelines.mixed_sizes`).

`SD3Transformer2DModel.forward` takes one [rows, c, h, w] latent tensor, so one size. Its parts take
rows of any size once the image is tokens: `PatchEmbed` is a convolution with stride = kernel = the
patch size plus a sin-cos table cropped around its centre to the row's patch grid
(`cropped_pos_embed`); the blocks are per token or per row except attention; `proj_out` is per token.
So a mixed-size forward runs those parts as the model's forward does, with three changes: the rows'
latents sit top-left on a zero canvas for one batched patch convolution, each row keeps its own
patches and adds its own cropped positions, and the image tokens are zero-padded to the longest row.
Positions are added before attention, so the layout has no rotation: its key mask covers the joint
attention's [image tokens | text tokens] and SD3.5's image-only second attention.
"""

from __future__ import annotations

from typing import Any

import torch

from batching.pipelines.mixed_sizes import RowAttention, RowLayout, install_joint_attention, pad_rows, padding_mask


def install(transformer: Any) -> RowAttention:
    """Mixed-size processors on every attention module of an SD3 transformer; `rows(layout)` activates them."""
    from diffusers.models.attention_processor import JointAttnProcessor2_0

    return install_joint_attention(transformer, JointAttnProcessor2_0(), text_first=False)


def mixed_size_forward(
    transformer: Any,
    row_attention: RowAttention,
    latents: list[torch.Tensor],
    timesteps: torch.Tensor,
    embeds: torch.Tensor,
    pooled: torch.Tensor,
) -> list[torch.Tensor]:
    """`SD3Transformer2DModel.forward` over rows of different sizes: each row's latents [c, h, w] in, its
    prediction [c, h, w] out."""
    patch_size = transformer.config.patch_size
    grids = [(row.shape[-2] // patch_size, row.shape[-1] // patch_size) for row in latents]  # patches per side
    hidden_states, num_tokens = embed_patches(transformer.pos_embed, latents)  # [rows, max tokens, dim]
    temb = transformer.time_text_embed(timesteps, pooled)  # [rows, dim]
    encoder_hidden_states = transformer.context_embedder(embeds)  # [rows, text tokens, dim]
    image_keys = padding_mask(num_tokens, hidden_states.shape[1], hidden_states.device)
    text_keys = image_keys.new_ones(len(latents), encoder_hidden_states.shape[1])
    layout = RowLayout(torch.cat([image_keys, text_keys], dim=1), image_key_mask=image_keys)  # [image | text]
    with row_attention.rows(layout):
        for block in transformer.transformer_blocks:
            encoder_hidden_states, hidden_states = block(
                hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states, temb=temb
            )
    hidden_states = transformer.proj_out(transformer.norm_out(hidden_states, temb))  # [rows, max tokens, p*p*c]
    predictions = []
    for row, (height, width) in zip(hidden_states, grids):
        patches = row[: height * width].reshape(height, width, patch_size, patch_size, -1)
        predictions.append(  # as the model unpatchifies: [c, h * p, w * p]
            torch.einsum("hwpqc->chpwq", patches).reshape(-1, height * patch_size, width * patch_size)
        )
    return predictions


def embed_patches(pos_embed: Any, latents: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """Each row's patch tokens plus its own cropped sin-cos positions, zero-padded to the longest row:
    ([rows, max tokens, dim], each row's number of tokens)."""
    num_rows, channels = len(latents), latents[0].shape[0]
    canvas = latents[0].new_zeros(
        num_rows, channels, max(row.shape[-2] for row in latents), max(row.shape[-1] for row in latents)
    )
    for index, row in enumerate(latents):
        canvas[index, :, : row.shape[-2], : row.shape[-1]] = row
    patches = pos_embed.proj(canvas)  # [rows, dim, max h / p, max w / p]: patches never overlap
    rows = []
    for index, row in enumerate(latents):
        height, width = (size // pos_embed.patch_size for size in row.shape[-2:])
        tokens = patches[index, :, :height, :width].flatten(1).transpose(0, 1)  # [h/p * w/p, dim]
        positions = pos_embed.cropped_pos_embed(*row.shape[-2:])[0]  # float32, as PatchEmbed adds them
        rows.append((tokens + positions).to(tokens.dtype))
    return pad_rows(rows)
