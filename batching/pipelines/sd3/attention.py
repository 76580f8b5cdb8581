"""SD3 rows of different sizes in one forward: per-row patch positions, padded image tokens, key masks.

`SD3Transformer2DModel.forward` takes one [rows, c, h, w] latent tensor, so one size. Its
parts take rows of any size once the image is tokens: `PatchEmbed` is a convolution with
stride = kernel = the patch size plus a sin-cos table cropped around its centre to the
row's patch grid (`cropped_pos_embed`); the blocks are per token or per row (norms, MLPs,
the timestep and pooled-text modulation) except attention; `proj_out` is per token. So a
mixed-size forward here runs those parts as the model's forward does, with three changes:
the rows' latents sit top-left on a zero canvas for one batched patch convolution, each
row keeps its own patches and adds its own cropped positions, and the image tokens are
zero-padded to the longest row. `MixedSizeJointAttnProcessor` (set on every attention
module) then masks the padding keys, in the joint attention ([image tokens | text tokens])
and in SD3.5's image-only second attention (`dual_attention_layers`), so no real token
attends to padding and a row's real tokens compute what they would alone. Without a mask
(uniform groups, deterministic mode) the processor is diffusers' own `JointAttnProcessor2_0`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class MixedSizeJointAttnProcessor:
    """SD3 joint attention that masks padded image keys while `image_key_mask` is set."""

    def __init__(self) -> None:
        from diffusers.models.attention_processor import JointAttnProcessor2_0

        self.uniform = JointAttnProcessor2_0()
        self.image_key_mask: torch.Tensor | None = None  # [rows, max image tokens] bool: True where the token is real

    @contextlib.contextmanager
    def masking(self, image_key_mask: torch.Tensor) -> Iterator[None]:
        self.image_key_mask = image_key_mask
        try:
            yield
        finally:
            self.image_key_mask = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, *args, **kwargs):
        image_key_mask = self.image_key_mask
        if image_key_mask is None:
            return self.uniform(attn, hidden_states, encoder_hidden_states, attention_mask, *args, **kwargs)
        num_rows, num_image_tokens = hidden_states.shape[:2]
        query, key, value = (_heads(attn, linear(hidden_states)) for linear in (attn.to_q, attn.to_k, attn.to_v))
        if attn.norm_q is not None:
            query, key = attn.norm_q(query), attn.norm_k(key)
        key_mask = image_key_mask
        if encoder_hidden_states is not None:  # the joint attention: text tokens after the image tokens
            text_query, text_key, text_value = (
                _heads(attn, linear(encoder_hidden_states))
                for linear in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
            )
            if attn.norm_added_q is not None:
                text_query, text_key = attn.norm_added_q(text_query), attn.norm_added_k(text_key)
            query, key, value = (
                torch.cat(pair, dim=2) for pair in ((query, text_query), (key, text_key), (value, text_value))
            )
            text_keys = image_key_mask.new_ones(num_rows, encoder_hidden_states.shape[1])
            key_mask = torch.cat([image_key_mask, text_keys], dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=key_mask[:, None, None, :])
        out = out.transpose(1, 2).reshape(num_rows, -1, attn.heads * query.shape[-1]).to(query.dtype)
        image_out, text_out = out[:, :num_image_tokens], out[:, num_image_tokens:]
        image_out = attn.to_out[1](attn.to_out[0](image_out))
        if encoder_hidden_states is None:
            return image_out
        if not attn.context_pre_only:
            text_out = attn.to_add_out(text_out)
        return image_out, text_out


def _heads(attn, tensor: torch.Tensor) -> torch.Tensor:
    """[rows, tokens, heads * head_dim] to [rows, heads, tokens, head_dim]."""
    return tensor.unflatten(-1, (attn.heads, -1)).transpose(1, 2)


def mixed_size_forward(
    transformer,
    attention: MixedSizeJointAttnProcessor,
    latents: list[torch.Tensor],
    timesteps: torch.Tensor,
    embeds: torch.Tensor,
    pooled: torch.Tensor,
) -> list[torch.Tensor]:
    """`SD3Transformer2DModel.forward` over rows of different sizes: each row's latents [c, h, w] in, its
    prediction [c, h, w] out."""
    patch_size = transformer.config.patch_size
    grids = [(row.shape[-2] // patch_size, row.shape[-1] // patch_size) for row in latents]  # patches per side
    hidden_states, image_key_mask = embed_patches(transformer.pos_embed, latents)  # [rows, max tokens, dim]
    temb = transformer.time_text_embed(timesteps, pooled)  # [rows, dim]
    encoder_hidden_states = transformer.context_embedder(embeds)  # [rows, text tokens, dim]
    with attention.masking(image_key_mask):
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


def embed_patches(pos_embed, latents: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's patch tokens plus its own cropped sin-cos positions, zero-padded to the longest row:
    ([rows, max tokens, dim], the [rows, max tokens] mask of real tokens)."""
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
    num_tokens = torch.tensor([len(row) for row in rows], device=canvas.device)
    hidden_states = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    image_key_mask = torch.arange(hidden_states.shape[1], device=canvas.device)[None, :] < num_tokens[:, None]
    return hidden_states, image_key_mask
