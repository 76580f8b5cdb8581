"""`ZImageTransformer2DModel.forward` (its basic, non-omni mode) over packed rows (`batching.pipelines.packing`).

Z-Image pads each row's image patches and caption tokens to a multiple of 32 with learned pad tokens,
and those tokens are part of the row's sequence alone (they attend and are attended to): each row keeps
them. What the model adds only to batch rows of different lengths (padding to the longest, masked)
is gone: the image tokens, the caption tokens and their joined [image | caption] sequence are each
packed, the refiners and the main blocks run over them with attention per row, and each block's
modulation (of the row's timestep) is laid over the row's tokens. The calls are the model's own
submodules and helpers, in its forward's order.

Stages (for the step cache, `zimage.step_cache`): `embed`, `refine_captions` (over any subset of the
rows), `unify`, `run_layers` (any blocks, any subset with `ZImageLayout.select_unified`), `output`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from batching.pipelines.packed_attention import rotate_complex, self_attention
from batching.pipelines.packing import Joint, Segments

PATCH_SIZE, F_PATCH_SIZE = 2, 1  # what ZImagePipeline passes (the transformer's defaults)
PATCH = f"{PATCH_SIZE}-{F_PATCH_SIZE}"


@dataclass(eq=False)
class ZImageLayout:
    """One forward's rows: their image and caption tokens (each padded to a multiple of 32, as alone), joined per
    row as [image | caption], with each token's rotary frequencies and which tokens are the model's pad tokens."""

    sizes: list[tuple[int, int, int]]  # per row (frames, height, width) of its latents
    image: Segments
    captions: Segments
    image_freqs: torch.Tensor  # [image tokens, head_dim / 2] complex
    caption_freqs: torch.Tensor  # [caption tokens, head_dim / 2] complex
    image_pad: torch.Tensor  # [image tokens, 1] bool: the row's pad tokens
    caption_pad: torch.Tensor  # [caption tokens, 1] bool
    unified: Joint = field(init=False)
    unified_freqs: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.unified = Joint((self.image, self.captions))
        self.unified_freqs = self.unified.join(self.image_freqs, self.caption_freqs)

    def select_unified(self, rows: Sequence[int]) -> tuple[Segments, torch.Tensor, torch.Tensor]:
        """The unified sequence of `rows` alone: its segments, their tokens' positions in it, and their freqs."""
        segments, index = self.unified.segments.select(rows)
        return segments, index, self.unified_freqs.index_select(0, index)

    def select_captions(self, rows: Sequence[int]) -> tuple[Segments, torch.Tensor, torch.Tensor]:
        segments, index = self.captions.select(rows)
        return segments, index, self.caption_freqs.index_select(0, index)


def build_layout(
    model: Any, sizes: Sequence[tuple[int, int, int]], caption_lengths: Sequence[int], device: torch.device
) -> ZImageLayout:
    """Each row's positions and pad tokens, as the model's `patchify_and_embed` makes them for that row alone."""
    image_ids, image_pads, caption_ids, caption_pads = [], [], [], []
    image_lengths, caption_lengths_padded = [], []
    for (frames, height, width), caption_length in zip(sizes, caption_lengths):
        padded_caption = caption_length + (-caption_length) % 32  # the model's SEQ_MULTI_OF
        _, ids, pad, total, _ = model._pad_with_ids(
            torch.empty(caption_length, 0, device=device), (padded_caption, 1, 1), (1, 0, 0), device
        )
        caption_ids.append(ids[:total])  # as the model trims them to the row's own padded length
        caption_pads.append(pad)
        caption_lengths_padded.append(total)
        grid = (frames // F_PATCH_SIZE, height // PATCH_SIZE, width // PATCH_SIZE)
        num_patches = grid[0] * grid[1] * grid[2]
        _, ids, pad, total, _ = model._pad_with_ids(
            torch.empty(num_patches, 0, device=device), grid, (padded_caption + 1, 0, 0), device
        )
        image_ids.append(ids)
        image_pads.append(pad)
        image_lengths.append(total)
    return ZImageLayout(
        list(sizes),
        Segments(tuple(image_lengths), device),
        Segments(tuple(caption_lengths_padded), device),
        model.rope_embedder(torch.cat(image_ids)),
        model.rope_embedder(torch.cat(caption_ids)),
        torch.cat(image_pads)[:, None],
        torch.cat(caption_pads)[:, None],
    )


@dataclass
class Embedded:
    adaln: torch.Tensor  # [rows, adaln_dim]: each row's timestep embedding
    image: torch.Tensor  # [1, image tokens, dim], through the noise refiner
    captions: torch.Tensor  # [1, caption tokens, dim], embedded (not refined yet)


def embed(
    model: Any, layout: ZImageLayout, latents: Sequence[torch.Tensor], t: torch.Tensor, captions: Sequence[torch.Tensor]
) -> Embedded:
    """Per row latents [c, frames, h, w] and caption features [tokens, cap_dim], `t` [rows] in [0, 1]: the image
    tokens embedded and refined, the caption tokens embedded."""
    adaln = model.t_embedder(t * model.t_scale).type_as(latents[0])
    patches = [
        _padded(model._patchify_image(row, PATCH_SIZE, F_PATCH_SIZE)[0], n)
        for row, n in zip(latents, layout.image.lengths)
    ]
    with layout.image.lora_tokens():
        image = model.all_x_embedder[PATCH](torch.cat(patches))
        image = torch.where(layout.image_pad, model.x_pad_token, image)[None]
        image = run_layers(model.noise_refiner, image, layout.image, layout.image_freqs, adaln)
    caption_rows = [_padded(row, n) for row, n in zip(captions, layout.captions.lengths)]
    with layout.captions.lora_tokens():
        embedded = model.cap_embedder(torch.cat(caption_rows))
    return Embedded(adaln, image, torch.where(layout.caption_pad, model.cap_pad_token, embedded)[None])


def refine_captions(model: Any, layout: ZImageLayout, captions: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """`captions` [1, caption tokens, dim] with `rows`' caption tokens through the context refiner (no timestep
    modulates it); the other rows' tokens as they are."""
    if len(rows) == layout.captions.num_rows:
        return run_layers(model.context_refiner, captions, layout.captions, layout.caption_freqs, None)
    segments, index, freqs = layout.select_captions(rows)
    refined = captions.clone()
    refined[:, index] = run_layers(model.context_refiner, captions[:, index], segments, freqs, None)
    return refined


def unify(layout: ZImageLayout, image: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
    """[1, unified tokens, dim]: each row's [image | caption] tokens, packed row by row."""
    return layout.unified.join(image[0], captions[0])[None]


def run_layers(
    layers: Sequence[Any], hidden: torch.Tensor, rows: Segments, freqs: torch.Tensor, adaln: torch.Tensor | None
) -> torch.Tensor:
    """Blocks over packed [1, tokens, dim]; `adaln` [rows, adaln_dim] modulates them (None: the context refiner's
    unmodulated blocks)."""
    with rows.lora_tokens():
        for layer in layers:
            hidden = block(layer, hidden, rows, freqs, adaln)
    return hidden


def output(model: Any, layout: ZImageLayout, unified: torch.Tensor, adaln: torch.Tensor) -> list[torch.Tensor]:
    """The final layer (modulated by each row's timestep) over the image tokens, unpatchified: per row [c, f, h, w]."""
    image = layout.unified.unjoin(unified[0])[0]  # [image tokens, dim]: the caption tokens' outputs are unused
    final = model.all_final_layer[PATCH]
    scale = 1.0 + layout.image.per_token(final.adaLN_modulation(adaln))
    with layout.image.lora_tokens():
        out = final.linear(final.norm_final(image[None]) * scale[None])[0]
    return model.unpatchify(layout.image.split(out), layout.sizes, PATCH_SIZE, F_PATCH_SIZE)


def forward(
    model: Any, layout: ZImageLayout, latents: Sequence[torch.Tensor], t: torch.Tensor, captions: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """The whole forward over packed rows (`embed`'s inputs): per row [c, frames, h, w]."""
    state = embed(model, layout, latents, t, captions)
    refined = refine_captions(model, layout, state.captions, range(layout.captions.num_rows))
    unified = unify(layout, state.image, refined)
    unified = run_layers(model.layers, unified, layout.unified.segments, layout.unified_freqs, state.adaln)
    return output(model, layout, unified, state.adaln)


def block(layer: Any, x: torch.Tensor, rows: Segments, freqs: torch.Tensor, adaln: torch.Tensor | None) -> torch.Tensor:
    """`ZImageTransformerBlock.forward` over packed [1, tokens, dim], each row modulated by its own `adaln`."""

    def rotate(tensor: torch.Tensor) -> torch.Tensor:
        return rotate_complex(tensor, freqs)

    if not layer.modulation:  # the context refiner's blocks
        x = x + layer.attention_norm2(self_attention(layer.attention, layer.attention_norm1(x), rows, rotate))
        return x + layer.ffn_norm2(layer.feed_forward(layer.ffn_norm1(x)))
    assert adaln is not None
    scale_msa, gate_msa, scale_mlp, gate_mlp = modulated_input_scales(layer, adaln, rows)
    x = x + gate_msa * layer.attention_norm2(
        self_attention(layer.attention, layer.attention_norm1(x) * scale_msa, rows, rotate)
    )
    return x + gate_mlp * layer.ffn_norm2(layer.feed_forward(layer.ffn_norm1(x) * scale_mlp))


def modulated_input_scales(layer: Any, adaln: torch.Tensor, rows: Segments) -> list[torch.Tensor]:
    """A modulated block's (1 + scale_msa, tanh(gate_msa), 1 + scale_mlp, tanh(gate_mlp)), each row's laid over
    its tokens: [1, tokens, dim] each."""
    scale_msa, gate_msa, scale_mlp, gate_mlp = layer.adaLN_modulation(adaln).chunk(4, dim=1)  # [rows, dim] each
    per_row = (1.0 + scale_msa, gate_msa.tanh(), 1.0 + scale_mlp, gate_mlp.tanh())
    return [rows.per_token(values)[None] for values in per_row]


def _padded(tokens: torch.Tensor, length: int) -> torch.Tensor:
    """A row's [n, dim] tokens padded to `length` by repeating the last, as the model pads (its pad token then
    replaces them)."""
    return torch.cat([tokens, tokens[-1:].expand(length - tokens.shape[0], -1)]) if length > tokens.shape[0] else tokens
