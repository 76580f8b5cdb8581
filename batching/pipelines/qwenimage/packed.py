"""`QwenImageTransformer2DModel.forward` over packed rows (`batching.pipelines.packing`).

A Qwen-Image row's image stream is its own latents' tokens, then (an edit model's) its edit image's;
its text stream is its prompt's tokens, of the prompt's own length. Both streams are packed, each row
is rotated by its own positions (the transformer's own rotary embedding of the row's image shapes and
prompt length: its text positions start after the row's largest image side), and the joint attention
([text | image]) runs per row. A row's modulation (its timestep embedding) is laid over its tokens;
a `zero_cond_t` model (Qwen-Image-Edit-2511) modulates a row's edit-image tokens with timestep 0, as
the model's own `modulate_index` does. The calls are the model's own submodules in its forward's order,
split for First-Block Cache (`embed`, `run_blocks` over any blocks and any subset of the rows with
`QwenLayout.select`, `output`), as FLUX's forward is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from batching.pipelines.packed_attention import joint_attention, rotate_complex
from batching.pipelines.packing import Joint, Segments, continuous_norm, device_tensor

ImageShapes = list[tuple[int, int, int]]  # one row's (frames, height, width) in latent patches, as img_shapes


@dataclass(eq=False)
class QwenLayout:
    """One forward's rows: their text and image tokens joined per row as [text | image], each joint token's rotary
    frequencies, and the row of the modulation each image token takes."""

    text: Segments
    image: Segments
    freqs: torch.Tensor  # [joint tokens, head_dim / 2] complex
    image_modulation: torch.Tensor  # [image tokens] int64: a row (or, zero_cond_t, rows + row for edit tokens)
    zero_cond_t: bool  # the embedding has a second row per row, at timestep 0, for its edit-image tokens
    joint: Joint = field(init=False)
    _selections: dict[tuple[int, ...], QwenLayout] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.joint = Joint((self.text, self.image))

    def select(self, rows: Sequence[int]) -> QwenLayout:
        """The layout of `rows` alone (a step cache's rows that compute), kept per row set; its modulation rows
        are `modulation_rows(rows)` of this one's."""
        key = tuple(rows)
        if key not in self._selections:
            text, _ = self.text.select(key)
            image, image_index = self.image.select(key)
            freqs = self.freqs.index_select(0, self.joint.segments.token_index(key))
            renumbered = [-1] * (2 * self.text.num_rows)  # a modulation row of this layout -> of the selection's
            for own, row in enumerate(self.modulation_rows(key)):
                renumbered[row] = own
            lookup = device_tensor(renumbered, torch.int64, self.image.device)
            modulation = lookup[self.image_modulation[image_index]]
            self._selections[key] = QwenLayout(text, image, freqs, modulation, self.zero_cond_t)
        return self._selections[key]

    def modulation_rows(self, rows: Sequence[int]) -> list[int]:
        """The rows of the timestep embedding that `rows` take: their own (and, zero_cond_t, their edit tokens')."""
        return [*rows, *(self.text.num_rows + row for row in rows)] if self.zero_cond_t else list(rows)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        return rotate_complex(x, self.freqs)


def build_layout(
    transformer: Any, image_shapes: Sequence[ImageShapes], text_lengths: Sequence[int], device: torch.device
) -> QwenLayout:
    """The layout of rows whose image streams are `image_shapes` (the row's own image, then any others) and whose
    prompts have `text_lengths` tokens, with the transformer's own rotary frequencies for each row alone."""
    freqs, modulation = [], []
    for row, (shapes, text_length) in enumerate(zip(image_shapes, text_lengths)):
        image_freqs, text_freqs = transformer.pos_embed([shapes], device=device, max_txt_seq_len=text_length)
        freqs += [text_freqs, image_freqs]
        own, others = _num_tokens(shapes[:1]), _num_tokens(shapes[1:])
        extra_row = row + len(image_shapes) if transformer.zero_cond_t else row  # zero_cond_t: timestep 0
        modulation += [row] * own + [extra_row] * others
    image = Segments(tuple(_num_tokens(shapes) for shapes in image_shapes), device)
    layout = QwenLayout(
        Segments(tuple(text_lengths), device),
        image,
        torch.cat(freqs),
        device_tensor(modulation, torch.int64, device),
        bool(transformer.zero_cond_t),
    )
    return layout


def embed(
    transformer: Any,
    layout: QwenLayout,
    latents: torch.Tensor,  # [1, image tokens, 64]: every row's image stream
    timestep: torch.Tensor,  # [rows], in [0, 1]
    embeds: torch.Tensor,  # [1, text tokens, text_dim]: every row's prompt states
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed image [1, image tokens, dim] and text [1, text tokens, dim] streams, and the timestep embedding
    [rows, dim] (zero_cond_t: [2 * rows, dim], each row's edit-image tokens at timestep 0 after the rows)."""
    model = transformer
    with layout.image.lora_tokens():
        image = model.img_in(latents)
    timestep = timestep.to(image.dtype)
    if layout.zero_cond_t:
        timestep = torch.cat([timestep, timestep * 0])
    with layout.text.lora_tokens():
        text = model.txt_in(model.txt_norm(embeds))
    return image, text, model.time_text_embed(timestep, image)


def run_blocks(
    blocks: Sequence[Any], image: torch.Tensor, text: torch.Tensor, temb: torch.Tensor, layout: QwenLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """`blocks` over the packed streams: the image and text tokens after them."""
    for transformer_block in blocks:
        image, text = block(transformer_block, image, text, temb, layout)
    return image, text


def output(transformer: Any, layout: QwenLayout, image: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
    """[1, image tokens, 64]: the prediction of every row's image stream (an edit image's tokens included)."""
    if layout.zero_cond_t:
        temb = temb.chunk(2, dim=0)[0]
    with layout.image.lora_tokens():
        return transformer.proj_out(continuous_norm(transformer.norm_out, image, temb, layout.image))


def forward(transformer: Any, layout: QwenLayout, latents: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """The whole forward over packed rows (`embed`'s inputs): [1, image tokens, 64]."""
    image, text, temb = embed(transformer, layout, latents, *inputs)
    image, _ = run_blocks(transformer.transformer_blocks, image, text, temb, layout)
    return output(transformer, layout, image, temb)


def block(
    transformer_block: Any, image: torch.Tensor, text: torch.Tensor, temb: torch.Tensor, layout: QwenLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """`QwenImageTransformerBlock.forward` over packed image [1, tokens, dim] and text [1, tokens, dim]."""
    b = transformer_block
    image_mod = b.img_mod(temb).index_select(0, layout.image_modulation)[None]  # [1, image tokens, 6 * dim]
    text_mod = layout.text.per_token(b.txt_mod(temb[: layout.text.num_rows]))[None]  # [1, text tokens, 6 * dim]
    image_mod1, image_mod2 = image_mod.chunk(2, dim=-1)
    text_mod1, text_mod2 = text_mod.chunk(2, dim=-1)
    image_modulated, image_gate1 = _modulate(b.img_norm1(image), image_mod1)
    text_modulated, text_gate1 = _modulate(b.txt_norm1(text), text_mod1)
    attn_image, attn_text = joint_attention(b.attn, image_modulated, text_modulated, layout.joint, layout.rotate)
    assert attn_text is not None
    image = image + image_gate1 * attn_image
    text = text + text_gate1 * attn_text
    image_modulated2, image_gate2 = _modulate(b.img_norm2(image), image_mod2)
    with layout.image.lora_tokens():
        image = image + image_gate2 * b.img_mlp(image_modulated2)
    text_modulated2, text_gate2 = _modulate(b.txt_norm2(text), text_mod2)
    with layout.text.lora_tokens():
        text = text + text_gate2 * b.txt_mlp(text_modulated2)
    if text.dtype == torch.float16:
        text = text.clip(-65504, 65504)
    if image.dtype == torch.float16:
        image = image.clip(-65504, 65504)
    return image, text


def _modulate(x: torch.Tensor, mod: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's `_modulate` with a (shift, scale, gate) per token: (modulated x, gate)."""
    shift, scale, gate = mod.chunk(3, dim=-1)
    return x * (1 + scale) + shift, gate


def _num_tokens(shapes: ImageShapes) -> int:
    return sum(frames * height * width for frames, height, width in shapes)
