"""First-Block Cache for the FLUX.1 transformer, decided per sample inside one forward.

The packed forward (`flux.packed`) split where the cache decides: the embeddings and the first
double-stream block run on every row; each caching sample's first-block residual (what that block
added to its image tokens) is compared with the one at its last full step (`step_cache_rows.decide`);
the other double-stream blocks and every single-stream block run only on the rows of samples that
compute, packed on their own (`FluxLayout.select`); a sample that skips adds the image-token residual
those blocks added at its last full step. The output norm (modulated by each row's own timestep) and
projection run on every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batching.pipelines.contract import CachedSample
from batching.pipelines.flux import packed
from batching.pipelines.flux.packed import Embedded, FluxLayout
from batching.pipelines.step_cache_rows import decide, reuse_residuals, rows_to_run


def first_block_cached_forward(
    transformer: Any,
    layout: FluxLayout,
    latents: torch.Tensor,  # [1, image tokens, 64], packed
    inputs: dict[str, Any],  # packed.embed's: timestep, guidance, pooled, embeds
    samples: Sequence[CachedSample],
    *,
    may_gather: bool,
) -> tuple[torch.Tensor, list[bool]]:
    """The transformer's prediction [1, image tokens, 64] and which samples skipped."""
    model = transformer
    state = packed.embed(model, layout, latents, **inputs)
    first = packed.run_blocks(model.transformer_blocks[:1], (), state, layout)
    before, after_first = layout.image.split(state.image[0]), layout.image.split(first.image[0])
    features = [now - then for now, then in zip(after_first, before)]  # per row [tokens_i, dim]
    skipped = decide(samples, features)
    rows = rows_to_run(samples, skipped, layout.image.num_rows, may_gather)
    out = first.image.clone()  # [1, image tokens, dim]: the last block's image tokens, filled in below
    rest = (model.transformer_blocks[1:], model.single_transformer_blocks)
    if len(rows) == layout.image.num_rows:
        out = packed.run_blocks(*rest, first, layout).image
    elif rows:
        index = layout.image.token_index(rows)
        part = Embedded(first.image[:, index], first.text[rows], first.temb[rows])
        out[:, index] = packed.run_blocks(*rest, part, layout.select(rows)).image
    reuse_residuals(samples, skipped, features, after_first, layout.image.split(out[0]))
    return packed.output(model, out, state.temb, layout), skipped
