"""`SD3Transformer2DModel.forward` over packed rows of different sizes (`batching.pipelines.packing`).

`SD3Transformer2DModel.forward` takes one [rows, c, h, w] latent tensor, so one size. Its parts take rows
of any size once the image is tokens: `PatchEmbed` (a convolution with stride = kernel = the patch size,
plus a sin-cos table cropped around its centre to the row's patch grid) runs on each row; the blocks
work per token or per row except attention; `proj_out` is per token. So the packed forward runs those
parts in the model's order with each row's image tokens packed into one sequence, its 333 text tokens
a [rows, 333, dim] batch, each row's modulation laid over its own tokens, and the joint attention
([image | text], SD3's order) and SD3.5's image-only second attention run per row. Positions are added
before attention, so there is no rotary table. Split for First-Block Cache (`embed`, `run_blocks`
over any blocks and any subset of the rows with `SD3Layout.select`, `output`), as FLUX's forward is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from batching.pipelines.packed_attention import joint_attention, self_attention
from batching.pipelines.packing import Joint, Segments, continuous_norm, modulation


@dataclass(eq=False)
class SD3Layout:
    grids: list[tuple[int, int]]  # per row (height, width) in patches
    image: Segments
    text: Segments
    joint: Joint = field(init=False)

    _selections: dict[tuple[int, ...], SD3Layout] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.joint = Joint((self.image, self.text))  # SD3 joins [image | text]

    def select(self, rows: Sequence[int]) -> SD3Layout:
        """The layout of `rows` alone (a step cache's rows that compute), kept per row set."""
        key = tuple(rows)
        if key not in self._selections:
            image, _ = self.image.select(key)
            text, _ = self.text.select(key)
            self._selections[key] = SD3Layout([self.grids[row] for row in key], image, text)
        return self._selections[key]


def build_layout(grids: Sequence[tuple[int, int]], num_text_tokens: int, device: torch.device) -> SD3Layout:
    image = Segments(tuple(height * width for height, width in grids), device)
    return SD3Layout(list(grids), image, Segments((num_text_tokens,) * len(grids), device))


def embed(
    transformer: Any,
    layout: SD3Layout,
    latents: Sequence[torch.Tensor],  # per row [c, h, w]
    timesteps: torch.Tensor,  # [rows]
    embeds: torch.Tensor,  # [rows, 333, t5_width]
    pooled: torch.Tensor,  # [rows, pooled_width]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed image tokens [1, image tokens, dim], the text [rows, 333, dim] and each row's embedding
    [rows, dim] of its timestep and pooled prompt."""
    model = transformer
    with layout.image.lora_tokens():
        image = embed_patches(model.pos_embed, latents)
        return image, model.context_embedder(embeds), model.time_text_embed(timesteps, pooled)


def run_blocks(
    blocks: Sequence[Any], image: torch.Tensor, text: torch.Tensor, temb: torch.Tensor, layout: SD3Layout
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`blocks` over the packed rows: the image tokens after them, and the text (None after the last block)."""
    out_text: torch.Tensor | None = text
    with layout.image.lora_tokens():
        for transformer_block in blocks:
            assert out_text is not None  # only the last block leaves no text
            image, out_text = block(transformer_block, image, out_text, temb, layout)
    return image, out_text


def output(transformer: Any, layout: SD3Layout, image: torch.Tensor, temb: torch.Tensor) -> list[torch.Tensor]:
    """Each row's prediction [c, h, w] from the image tokens after the last block."""
    model = transformer
    with layout.image.lora_tokens():
        out = model.proj_out(continuous_norm(model.norm_out, image, temb, layout.image))[0]  # [tokens, p * p * c]
    patch = model.config.patch_size
    predictions = []
    for row, (height, width) in zip(layout.image.split(out), layout.grids):
        patches = row.reshape(height, width, patch, patch, -1)
        predictions.append(  # as the model unpatchifies: [c, h * p, w * p]
            torch.einsum("hwpqc->chpwq", patches).reshape(-1, height * patch, width * patch)
        )
    return predictions


def forward(
    transformer: Any, layout: SD3Layout, latents: Sequence[torch.Tensor], *inputs: torch.Tensor
) -> list[torch.Tensor]:
    """Each row's prediction [c, h, w] (`embed`'s inputs)."""
    image, text, temb = embed(transformer, layout, latents, *inputs)
    image, _ = run_blocks(transformer.transformer_blocks, image, text, temb, layout)
    return output(transformer, layout, image, temb)


def embed_patches(pos_embed: Any, latents: Sequence[torch.Tensor]) -> torch.Tensor:
    """Each row's patch tokens plus its own cropped sin-cos positions, as `PatchEmbed` makes them for the row
    alone, packed: [1, image tokens, dim]."""
    rows = []
    for row in latents:
        tokens = pos_embed.proj(row[None]).flatten(2).transpose(1, 2)[0]  # [h/p * w/p, dim]
        positions = pos_embed.cropped_pos_embed(*row.shape[-2:])[0]  # float32, as PatchEmbed adds them
        rows.append((tokens + positions).to(tokens.dtype))
    return torch.cat(rows)[None]


def block(
    transformer_block: Any, image: torch.Tensor, text: torch.Tensor, temb: torch.Tensor, layout: SD3Layout
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`JointTransformerBlock.forward`: packed image tokens [1, tokens, dim], text [rows, 333, dim]; the text
    after the block, or None after the last one (`context_pre_only`)."""
    b = transformer_block
    norm = b.norm1
    mod = norm.linear(norm.silu(temb))
    normed = norm.norm(image)
    if b.use_dual_attention:  # SD3.5: a second, image-only attention with its own modulation
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, shift_msa2, scale_msa2, gate_msa2 = modulation(
            mod, layout.image, 9
        )
        norm_image2 = normed * (1 + scale_msa2) + shift_msa2
    else:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation(mod, layout.image, 6)
    norm_image = normed * (1 + scale_msa) + shift_msa
    if b.context_pre_only:
        norm_text = continuous_norm(b.norm1_context, text, temb, None)
    else:
        context_norm = b.norm1_context
        c_shift_msa, c_scale_msa, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = modulation(
            context_norm.linear(context_norm.silu(temb)), None, 6
        )
        norm_text = context_norm.norm(text) * (1 + c_scale_msa) + c_shift_msa
    attn_image, attn_text = joint_attention(b.attn, norm_image, norm_text, layout.joint, text_first=False)
    image = image + gate_msa * attn_image
    if b.use_dual_attention:
        image = image + gate_msa2 * self_attention(b.attn2, norm_image2, layout.image)
    image = image + gate_mlp * b.ff(b.norm2(image) * (1 + scale_mlp) + shift_mlp)
    if b.context_pre_only:
        return image, None
    assert attn_text is not None
    text = text + c_gate_msa * attn_text
    text = text + c_gate_mlp * b.ff_context(b.norm2_context(text) * (1 + c_scale_mlp) + c_shift_mlp)
    return image, text
