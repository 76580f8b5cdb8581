"""Rows of different sizes in one transformer forward: padded tokens, per-row positions, key masks.

In a DiT, attention is the one place where a row's tokens meet; norms, MLPs and timestep
modulation work per token or per row. So rows whose token counts or positions differ (image
sizes, reference or edit images, prompt lengths) share one forward when each row's tokens are
zero-padded to the longest row's, each row is rotated by its own positions, and the padding
keys are masked: no real token attends to padding, rows never meet, and a row's real tokens
compute what they would alone. A transformer takes one position table for its whole batch, so
this helper takes over its attention while a `RowLayout` is active (`RowAttention.rows`);
otherwise every processor is diffusers' own, untouched.

A family configures it with what is its own: the processors of its attention modules
(`JointAttention` serves the MMDiT blocks of FLUX.1, FLUX.2, Qwen-Image and SD3; a family with
another kind of block writes its processor around `masked_attention`), its rotary embedding
(`RowLayout.rotation`) and the order of its text and image tokens (`RowLayout.key_mask`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Rotation = Callable[[torch.Tensor], torch.Tensor]  # [rows, tokens, heads, head_dim] -> the same, each row rotated


@dataclass
class RowLayout:
    """One mixed-size forward's per-row attention inputs, over the keys in the order the family joins them."""

    key_mask: torch.Tensor  # [rows, keys] bool: True where the key is a real token
    rotation: Rotation | None = None  # rotates queries and keys by each row's own positions; None: positions were
    # added to the tokens before attention (SD3)
    image_key_mask: torch.Tensor | None = None  # [rows, image tokens]: the keys of an attention over the image
    # tokens alone (SD3.5's second attention); None: no such attention


class RowAttention:
    """Which layout the mixed-size processors of one transformer use in the forward under way."""

    def __init__(self) -> None:
        self.layout: RowLayout | None = None

    @contextlib.contextmanager
    def rows(self, layout: RowLayout) -> Iterator[None]:
        self.layout = layout
        try:
            yield
        finally:
            self.layout = None


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_mask: torch.Tensor,
    rotation: Rotation | None = None,
    backend: Any = None,
) -> torch.Tensor:
    """Attention over [rows, tokens, heads, head_dim] queries, keys and values, rotated by each row's positions,
    padding keys masked, as diffusers dispatches it: [rows, tokens, heads * head_dim] in the queries' dtype."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    if rotation is not None:
        query, key = rotation(query), rotation(key)
    out = dispatch_attention_fn(query, key, value, attn_mask=key_mask, backend=backend)
    return out.flatten(2, 3).to(query.dtype)


class JointAttention:
    """The joint attention of an MMDiT block (a text stream and an image stream projected apart, attended as one
    sequence) with each row's own positions and key mask while a layout is active; diffusers' `uniform` processor
    otherwise. `text_first`: the order the family joins the streams (FLUX, Qwen-Image: text first; SD3: image
    first). A call without a text stream is an image-only attention (FLUX.1's single-stream blocks, whose tokens
    hold the text already; SD3.5's second attention)."""

    def __init__(self, row_attention: RowAttention, uniform: Any, *, text_first: bool = True) -> None:
        self.row_attention = row_attention
        self.uniform = uniform
        self.text_first = text_first
        self._uniform_arguments = set(inspect.signature(uniform.__call__).parameters)

    # Every argument a family's attention module passes is named here: diffusers hands a processor only the
    # keyword arguments its signature names.
    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        image_rotary_emb=None,
        encoder_hidden_states_mask=None,
    ):
        layout = self.row_attention.layout
        if layout is None:
            given = {
                "encoder_hidden_states": encoder_hidden_states,
                "attention_mask": attention_mask,
                "image_rotary_emb": image_rotary_emb,
                "encoder_hidden_states_mask": encoder_hidden_states_mask,
            }
            return self.uniform(attn, hidden_states, **{k: v for k, v in given.items() if k in self._uniform_arguments})
        query, key, value = _heads(attn, hidden_states, attn.to_q, attn.to_k, attn.to_v)
        query, key = _normed(attn.norm_q, query), _normed(attn.norm_k, key)
        has_text = encoder_hidden_states is not None and getattr(attn, "add_q_proj", None) is not None
        if has_text:
            text_query, text_key, text_value = _heads(
                attn, encoder_hidden_states, attn.add_q_proj, attn.add_k_proj, attn.add_v_proj
            )
            text = (_normed(attn.norm_added_q, text_query), _normed(attn.norm_added_k, text_key), text_value)
            joined = [(t, i) if self.text_first else (i, t) for t, i in zip(text, (query, key, value))]
            query, key, value = (torch.cat(pair, dim=1) for pair in joined)
        key_mask = layout.key_mask if has_text or layout.image_key_mask is None else layout.image_key_mask
        backend = getattr(self.uniform, "_attention_backend", None)
        out = masked_attention(query, key, value, key_mask, layout.rotation, backend)
        if not has_text:
            return _project_out(attn, out) if hasattr(attn, "to_out") else out  # FLUX.1's single blocks project later
        num_text = encoder_hidden_states.shape[1]
        if self.text_first:
            text_out, image_out = out[:, :num_text], out[:, num_text:]
        else:
            image_out, text_out = out[:, : out.shape[1] - num_text], out[:, out.shape[1] - num_text :]
        if getattr(attn, "to_add_out", None) is not None:  # SD3's last block keeps no text output projection
            text_out = attn.to_add_out(text_out.contiguous())
        return _project_out(attn, image_out), text_out


def install_joint_attention(transformer: Any, uniform: Any, *, text_first: bool = True) -> RowAttention:
    """`JointAttention` around diffusers' processor `uniform` on every attention module of an MMDiT transformer;
    the returned `rows(layout)` activates it."""
    row_attention = RowAttention()
    transformer.set_attn_processor(JointAttention(row_attention, uniform, text_first=text_first))
    return row_attention


def _heads(attn: Any, hidden: torch.Tensor, *projections: Any) -> list[torch.Tensor]:
    return [projection(hidden).unflatten(-1, (attn.heads, -1)) for projection in projections]


def _normed(norm: Any, tensor: torch.Tensor) -> torch.Tensor:
    return tensor if norm is None else norm(tensor)


def _project_out(attn: Any, out: torch.Tensor) -> torch.Tensor:
    out = out.contiguous()
    for layer in attn.to_out:  # the output projection, then its dropout
        out = layer(out)
    return out


def padding_mask(lengths: Sequence[int], width: int, device: torch.device) -> torch.Tensor:
    """[rows, width] bool: True for each row's first `lengths[row]` positions, its real tokens."""
    return torch.arange(width, device=device)[None, :] < torch.tensor(list(lengths), device=device)[:, None]


def pad_rows(rows: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """Rows of tokens [tokens_i, dim] zero-padded to the longest: ([rows, max tokens, dim], each row's tokens)."""
    return torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True), [row.shape[0] for row in rows]


def unpadded(predictions: torch.Tensor, lengths: Sequence[int]) -> list[torch.Tensor]:
    """Each row's prediction for its own first `lengths[row]` tokens."""
    return [row[:length] for row, length in zip(predictions, lengths)]


def padded_tokens(latents: torch.Tensor | list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """A forward's latent tokens as [rows, max tokens, dim] and each row's token count: rows that came as a list
    (sizes differ) zero-padded to the longest (`pad_rows`), a tensor as it is."""
    if isinstance(latents, list):
        return pad_rows(latents)
    return latents, [latents.shape[1]] * latents.shape[0]


def own_tokens(
    latents: torch.Tensor | list[torch.Tensor], predictions: torch.Tensor, lengths: Sequence[int]
) -> torch.Tensor | list[torch.Tensor]:
    """The predictions of a forward over `padded_tokens(latents)` as its rows came: each row's own tokens (a list)
    when they came as a list, else the tensor as it is."""
    return unpadded(predictions, lengths) if isinstance(latents, list) else predictions


class LayoutCache:
    """The last forward's layout, reused while its rows' positions stay the same: a group's membership changes far
    less often than every step, and comparing positions costs far less than rebuilding the rotary tables."""

    def __init__(self) -> None:
        self._key: tuple[torch.Tensor, tuple] | None = None
        self._layout: RowLayout | None = None

    def get(self, positions: torch.Tensor, lengths: tuple, build: Callable[[], RowLayout]) -> RowLayout:
        key = self._key
        if key is None or key[1] != lengths or key[0].shape != positions.shape or not torch.equal(key[0], positions):
            self._key, self._layout = (positions.clone(), lengths), build()
        assert self._layout is not None
        return self._layout
