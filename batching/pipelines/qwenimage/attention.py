"""Qwen-Image rows of different image shapes in one forward: padded image tokens, per-row positions, key masks.

`QwenImageTransformer2DModel` takes per-row `img_shapes`, but its rotary embedding uses
the first row's for every row (diffusers warns that variable sizes are unsupported), and
the text tokens' positions start after the largest image side, so they too depend on
the row's image. To mix shapes, each row's image tokens (an edit row's: its own, then
its edit image's) are zero-padded to the group's longest, and `MixedShapeQwenAttnProcessor`
(set on every block) rotates each row by its own positions and masks the padding keys
of both streams. Everything else in the model works per token or per row (norms, MLPs,
timestep modulation), so a real token's output does not depend on the padding. Without
a `RowLayout` (rows of one shape) the processor is diffusers' own, untouched, and the
transformer's own text mask handles prompts of different lengths.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

ImageShapes = list[tuple[int, int, int]]  # one row's (frames, height, width) in latent patches, as img_shapes


@dataclass
class RowLayout:
    """One mixed-shape forward's per-row attention inputs, over [padded text tokens | padded image tokens]."""

    image_freqs: torch.Tensor  # [rows, max image tokens, 1, head_dim/2] complex: each row's image positions
    text_freqs: torch.Tensor  # [rows, max text tokens, 1, head_dim/2] complex: its text positions
    key_mask: torch.Tensor  # [rows, 1, 1, text + image tokens] bool: True where the key is a real token


class MixedShapeQwenAttnProcessor:
    """Qwen-Image's joint attention with per-row rotary positions and a key mask while a `RowLayout` is active."""

    def __init__(self) -> None:
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

        self.uniform = QwenDoubleStreamAttnProcessor2_0()
        self._attention = dispatch_attention_fn
        self.layout: RowLayout | None = None

    @contextlib.contextmanager
    def rows(self, layout: RowLayout) -> Iterator[None]:
        self.layout = layout
        try:
            yield
        finally:
            self.layout = None

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        encoder_hidden_states_mask=None,
        attention_mask=None,
        image_rotary_emb=None,
    ):
        layout = self.layout
        if layout is None:
            return self.uniform(
                attn, hidden_states, encoder_hidden_states, encoder_hidden_states_mask, attention_mask, image_rotary_emb
            )
        head_dim = attn.inner_dim // attn.heads
        image_qkv = [proj(hidden_states).unflatten(-1, (-1, head_dim)) for proj in (attn.to_q, attn.to_k, attn.to_v)]
        text_qkv = [
            proj(encoder_hidden_states).unflatten(-1, (-1, head_dim))
            for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
        ]
        image_query, image_key, image_value = image_qkv
        text_query, text_key, text_value = text_qkv
        if attn.norm_q is not None:
            image_query = attn.norm_q(image_query)
        if attn.norm_k is not None:
            image_key = attn.norm_k(image_key)
        if attn.norm_added_q is not None:
            text_query = attn.norm_added_q(text_query)
        if attn.norm_added_k is not None:
            text_key = attn.norm_added_k(text_key)
        image_query, image_key = (_rotate(x, layout.image_freqs) for x in (image_query, image_key))
        text_query, text_key = (_rotate(x, layout.text_freqs) for x in (text_query, text_key))
        out = self._attention(
            torch.cat([text_query, image_query], dim=1),
            torch.cat([text_key, image_key], dim=1),
            torch.cat([text_value, image_value], dim=1),
            attn_mask=layout.key_mask,
            dropout_p=0.0,
            is_causal=False,
            backend=self.uniform._attention_backend,
        )
        out = out.flatten(2, 3).to(image_query.dtype)
        num_text = encoder_hidden_states.shape[1]
        text_out, image_out = out[:, :num_text], out[:, num_text:]
        image_out = attn.to_out[0](image_out.contiguous())
        if len(attn.to_out) > 1:
            image_out = attn.to_out[1](image_out)
        return image_out, attn.to_add_out(text_out.contiguous())


def _rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Qwen-Image's complex rotary embedding (`apply_rotary_emb_qwen`, use_real=False), a table per row."""
    rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)) * freqs
    return torch.view_as_real(rotated).flatten(3).type_as(x)


def row_layout(
    transformer, image_shapes: Sequence[ImageShapes], num_image_tokens: Sequence[int], text_lengths: Sequence[int]
) -> RowLayout:
    """The layout of rows whose image tokens (padded to the longest) have `image_shapes`, and whose text tokens
    (padded to the longest) number `text_lengths`; positions from the transformer's own rotary embedding."""
    device = transformer.device
    max_text, max_image = max(text_lengths), max(num_image_tokens)
    image_rows, text_rows = [], []
    for shapes in image_shapes:
        image_freqs, text_freqs = transformer.pos_embed([shapes], device=device, max_txt_seq_len=max_text)
        padding = image_freqs.new_ones(max_image - image_freqs.shape[0], image_freqs.shape[1])  # padding keys: masked
        image_rows.append(torch.cat([image_freqs, padding]))
        text_rows.append(text_freqs)
    text_mask = torch.arange(max_text, device=device)[None, :] < torch.tensor(text_lengths, device=device)[:, None]
    image_mask = (
        torch.arange(max_image, device=device)[None, :] < torch.tensor(num_image_tokens, device=device)[:, None]
    )
    key_mask = torch.cat([text_mask, image_mask], dim=1)[:, None, None, :]
    return RowLayout(torch.stack(image_rows)[:, :, None], torch.stack(text_rows)[:, :, None], key_mask)
