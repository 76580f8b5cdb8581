"""`FluxTransformer2DModel.forward` over packed rows of different sizes (`batching.pipelines.packing`).

Each row's image tokens are packed into one sequence; its text tokens (512 T5 states, every row alike)
stay a [rows, 512, dim] batch. The calls are the model's own submodules in its forward's order; what
differs is that a row's modulation (its timestep and guidance embedding) is laid over its own tokens,
attention runs per row over [text | image] (`packed_attention`), and each row is rotated by its own
position ids. The single-stream blocks run on the joint sequence, packed row by row.

The forward is split where FLUX.1's First-Block Cache decides (`flux.step_cache`): `embed`, then the
double-stream blocks and the single-stream blocks (`run_blocks`, over any subset of the rows with
`FluxLayout.select`), then `output`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from batching.pipelines.packed_attention import joint_attention, self_attention
from batching.pipelines.packing import Joint, Segments, continuous_norm, modulation


@dataclass(eq=False)
class FluxLayout:
    """One forward's rows: their image and text tokens, joined per row as [text | image], and the rotary table of
    every joint token (each row's own position ids)."""

    image: Segments
    text: Segments  # every row's 512 text tokens
    cos: torch.Tensor  # [joint tokens, 1, head_dim] float32
    sin: torch.Tensor
    joint: Joint = field(init=False)
    _selections: dict[tuple[int, ...], FluxLayout] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.joint = Joint((self.text, self.image))

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """FLUX's rotary embedding (interleaved real and imaginary pairs) of joint [tokens, heads, head_dim]."""
        return rotate(x, self.cos, self.sin)

    def select(self, rows: Sequence[int]) -> FluxLayout:
        """The layout of `rows` alone (a step cache's rows that compute), kept per row set."""
        key = tuple(rows)
        if key not in self._selections:
            index = self.joint.segments.token_index(key)
            image, _ = self.image.select(key)
            text, _ = self.text.select(key)
            self._selections[key] = FluxLayout(
                image, text, self.cos.index_select(0, index), self.sin.index_select(0, index)
            )
        return self._selections[key]


def build_layout(transformer: Any, text_ids: torch.Tensor, image_ids: Sequence[torch.Tensor]) -> FluxLayout:
    """The layout of rows whose image tokens have `image_ids` (per row [tokens, axes]) after the shared `text_ids`
    [text tokens, axes], rotated by the transformer's own embedding of each row's ids."""
    tables = [transformer.pos_embed(torch.cat([text_ids, ids])) for ids in image_ids]  # per row (cos, sin)
    device = text_ids.device
    image = Segments(tuple(ids.shape[0] for ids in image_ids), device)
    text = Segments((text_ids.shape[0],) * len(image_ids), device)
    cos = torch.cat([row_cos for row_cos, _ in tables])[:, None]
    sin = torch.cat([row_sin for _, row_sin in tables])[:, None]
    return FluxLayout(image, text, cos, sin)


def position_ids(time: int, height: int, width: int, *length: int) -> torch.Tensor:
    """[height * width (* length), axes] float32 position ids (time, row, column[, index]) of a grid of tokens,
    row-major as the FLUX pipelines build them (FLUX.2's have the fourth axis)."""
    axes = (torch.tensor([time]), torch.arange(height), torch.arange(width), *(torch.arange(n) for n in length))
    return torch.cartesian_prod(*axes).float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding with interleaved real/imaginary pairs (FLUX's layout), a table row per token."""
    real, imaginary = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    rotated = torch.stack([-imaginary, real], dim=-1).flatten(-2)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


@dataclass
class Embedded:
    image: torch.Tensor  # [1, image tokens, dim]
    text: torch.Tensor  # [rows, text tokens, dim]
    temb: torch.Tensor  # [rows, dim]: each row's timestep (and guidance) embedding with its pooled prompt


def embed(
    transformer: Any,
    layout: FluxLayout,
    latents: torch.Tensor,  # [1, image tokens, 64]
    timestep: torch.Tensor,  # [rows], in [0, 1]
    guidance: torch.Tensor | None,  # [rows], or None without a guidance embedder
    pooled: torch.Tensor,  # [rows, pooled_dim]
    embeds: torch.Tensor,  # [rows, 512, t5_dim]
) -> Embedded:
    model = transformer
    with layout.image.lora_tokens():
        image = model.x_embedder(latents)
    timestep = timestep.to(image.dtype) * 1000
    if guidance is None:
        temb = model.time_text_embed(timestep, pooled)
    else:
        temb = model.time_text_embed(timestep, guidance.to(image.dtype) * 1000, pooled)
    return Embedded(image, model.context_embedder(embeds), temb)


def run_blocks(
    double_blocks: Sequence[Any], single_blocks: Sequence[Any], state: Embedded, layout: FluxLayout
) -> Embedded:
    """The blocks over the packed rows; the state after them (the text as the last double-stream block left it)."""
    image, text, temb = state.image, state.text, state.temb
    with layout.image.lora_tokens():
        for block in double_blocks:
            image, text = double_block(block, image, text, temb, layout)
    if single_blocks:
        image = run_single_stream(single_blocks, image, text, layout, lambda b, x: single_block(b, x, temb, layout))
    return Embedded(image, text, temb)


def run_single_stream(
    blocks: Sequence[Any],
    image: torch.Tensor,
    text: torch.Tensor,
    layout: FluxLayout,
    run_block: Callable[[Any, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Single-stream blocks (`run_block(block, joint)`) over each row's joint [text | image] sequence, packed row by
    row (FLUX.1's and FLUX.2's): the image tokens after them [1, image tokens, dim]."""
    joint = layout.joint.join(text.flatten(0, 1), image[0])[None]  # [1, joint tokens, dim]
    with layout.joint.segments.lora_tokens():
        for block in blocks:
            joint = run_block(block, joint)
    return layout.joint.unjoin(joint[0])[1][None]


def output(transformer: Any, image: torch.Tensor, temb: torch.Tensor, layout: FluxLayout) -> torch.Tensor:
    """The output norm (modulated by each row's embedding) and projection: [1, image tokens, 64]."""
    with layout.image.lora_tokens():
        return transformer.proj_out(continuous_norm(transformer.norm_out, image, temb, layout.image))


def forward(transformer: Any, layout: FluxLayout, latents: torch.Tensor, **inputs: torch.Tensor | None) -> torch.Tensor:
    """The whole forward over packed rows (`embed`'s inputs): [1, image tokens, 64]."""
    state = embed(transformer, layout, latents, **inputs)  # type: ignore[arg-type]
    state = run_blocks(transformer.transformer_blocks, transformer.single_transformer_blocks, state, layout)
    return output(transformer, state.image, state.temb, layout)


def double_block(
    block: Any, image: torch.Tensor, text: torch.Tensor, temb: torch.Tensor, layout: FluxLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """`FluxTransformerBlock.forward`: packed image tokens [1, tokens, dim], text [rows, 512, dim]."""
    norm, context_norm = block.norm1, block.norm1_context
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation(
        norm.linear(norm.silu(temb)), layout.image, 6
    )
    c_shift_msa, c_scale_msa, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = modulation(
        context_norm.linear(context_norm.silu(temb)), None, 6
    )
    norm_image = norm.norm(image) * (1 + scale_msa) + shift_msa
    norm_text = context_norm.norm(text) * (1 + c_scale_msa) + c_shift_msa
    return attend_and_feed(
        block,
        image,
        text,
        norm_image,
        norm_text,
        (gate_msa, shift_mlp, scale_mlp, gate_mlp),
        (c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp),
        layout,
    )


def attend_and_feed(
    block: Any,
    image: torch.Tensor,
    text: torch.Tensor,
    norm_image: torch.Tensor,
    norm_text: torch.Tensor,
    image_mod: tuple[torch.Tensor, ...],
    text_mod: tuple[torch.Tensor, ...],
    layout: FluxLayout,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rest of a FLUX.1 or FLUX.2 double-stream block once both streams are normed and modulated: joint
    attention, then each stream's feed-forward. `image_mod`, `text_mod`: (gate_msa, shift_mlp, scale_mlp,
    gate_mlp) of each stream."""
    gate_msa, shift_mlp, scale_mlp, gate_mlp = image_mod
    c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = text_mod
    attn_image, attn_text = joint_attention(block.attn, norm_image, norm_text, layout.joint, layout.rotate)
    assert attn_text is not None  # every block projects its text output (SD3's last one alone does not)
    image = image + gate_msa * attn_image
    image = image + gate_mlp * block.ff(block.norm2(image) * (1 + scale_mlp) + shift_mlp)
    text = text + c_gate_msa * attn_text
    text = text + c_gate_mlp * block.ff_context(block.norm2_context(text) * (1 + c_scale_mlp) + c_shift_mlp)
    if text.dtype == torch.float16:
        text = text.clip(-65504, 65504)
    return image, text


def single_block(block: Any, joint: torch.Tensor, temb: torch.Tensor, layout: FluxLayout) -> torch.Tensor:
    """`FluxSingleTransformerBlock.forward` over the joint sequence [1, tokens, dim], packed row by row."""
    rows = layout.joint.segments
    shift, scale, gate = modulation(block.norm.linear(block.norm.silu(temb)), rows, 3)
    normed = block.norm.norm(joint) * (1 + scale) + shift
    mlp = block.act_mlp(block.proj_mlp(normed))
    attn = self_attention(block.attn, normed, rows, layout.rotate)
    joint = joint + gate * block.proj_out(torch.cat([attn, mlp], dim=2))
    if joint.dtype == torch.float16:
        joint = joint.clip(-65504, 65504)
    return joint
