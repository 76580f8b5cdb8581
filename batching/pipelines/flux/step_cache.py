"""First-Block Cache for the FLUX.1 transformer, decided per sample inside one forward.

`FluxTransformer2DModel.forward` split where the cache decides: the embeddings and the first
double-stream block run on every row; each caching sample's first-block residual (what that
block added to its real image tokens) is compared with the one at its last full step
(`step_cache_rows.decide`); the other double-stream blocks and every single-stream block run
only on the rows of samples that compute, gathered into a smaller batch (with their own
`RowLayout` when the rows mix sizes); a sample that skips adds the image-token residual those
blocks added at its last full step. The output norm (modulated by each row's own timestep) and
projection run on every row. The calls are the model's own submodules, in its forward's order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from batching.pipelines.contract import CachedSample
from batching.pipelines.step_cache_rows import decide, reuse_residuals, rows_to_run

LayoutOf = Callable[[list[int]], contextlib.AbstractContextManager]  # batch rows -> their attention layout


def first_block_cached_forward(
    transformer: Any,
    latents: torch.Tensor,  # [rows, max image tokens, 64], zero-padded after each row's `num_tokens`
    num_tokens: list[int],
    inputs: dict[str, Any],  # timestep [rows] in [0, 1], guidance [rows] or None, pooled, embeds, text_ids, img_ids
    samples: Sequence[CachedSample],
    layout_of: LayoutOf,
    *,
    may_gather: bool,
) -> tuple[torch.Tensor, list[bool]]:
    """The transformer's prediction [rows, max image tokens, 64] and which samples skipped."""
    model = transformer
    hidden = model.x_embedder(latents)  # [rows, tokens, dim]
    timestep = inputs["timestep"].to(hidden.dtype) * 1000
    guidance = inputs["guidance"]
    if guidance is None:
        temb = model.time_text_embed(timestep, inputs["pooled"])
    else:
        temb = model.time_text_embed(timestep, guidance.to(hidden.dtype) * 1000, inputs["pooled"])
    context = model.context_embedder(inputs["embeds"])  # [rows, text tokens, dim]
    rotary = model.pos_embed(torch.cat((inputs["text_ids"], inputs["img_ids"]), dim=0))
    all_rows = list(range(len(num_tokens)))
    with layout_of(all_rows):
        context_first, first = model.transformer_blocks[0](
            hidden_states=hidden, encoder_hidden_states=context, temb=temb, image_rotary_emb=rotary
        )
    features = [first[row, :n] - hidden[row, :n] for row, n in enumerate(num_tokens)]  # per row [tokens_i, dim]
    skipped = decide(samples, features)
    rows = rows_to_run(samples, skipped, len(num_tokens), may_gather)
    out = first.clone()  # [rows, tokens, dim]: the last block's image tokens, filled in below
    if rows:
        index = torch.tensor(rows, device=hidden.device)
        part, part_context, part_temb = first[index], context_first[index], temb[index]
        with layout_of(rows):
            for block in [*model.transformer_blocks[1:], *model.single_transformer_blocks]:
                part_context, part = block(
                    hidden_states=part, encoder_hidden_states=part_context, temb=part_temb, image_rotary_emb=rotary
                )
        out[index] = part
    reuse_residuals(samples, skipped, features, first, out, num_tokens)
    return model.proj_out(model.norm_out(out, temb)), skipped
