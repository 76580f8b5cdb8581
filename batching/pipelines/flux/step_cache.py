"""First-Block Cache for the FLUX transformers (FLUX.1, FLUX.2 and klein), decided per sample inside one forward.

The packed forward (`flux.packed`, `flux2.packed`: `embed`, `run_blocks`, `output`) split where the
cache decides: the embeddings and the first double-stream block run on every row; each caching
sample's first-block residual (what that block added to its image tokens: a FLUX.2 row's reference
tokens included) is compared with the one at its last full step (`step_cache_rows.cached_blocks`);
the other double-stream blocks and every single-stream block run only on the rows of samples that
compute, packed on their own (`FluxLayout.select`); a sample that skips adds the image-token residual
those blocks added at its last full step. The output norm (modulated by each row's own timestep) and
projection run on every row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from batching.pipelines.contract import CachedSample
from batching.pipelines.flux.packed import Embedded, FluxLayout
from batching.pipelines.step_cache_rows import cached_blocks, first_block_features

NUM_BLOCKS_KEPT = 1  # the first double-stream block runs on every row: its residual decides
# the family's `run_blocks`: (double-stream blocks, single-stream blocks, state, layout) -> the state after them
RunBlocks = Callable[[Sequence[Any], Sequence[Any], Embedded, FluxLayout], Embedded]


def num_flux_blocks(transformer: Any) -> int:
    """Double- and single-stream blocks: the blocks a full forward runs, the unit the skipped fraction counts."""
    return len(transformer.transformer_blocks) + len(transformer.single_transformer_blocks)


def first_block_cached_blocks(
    transformer: Any,
    layout: FluxLayout,
    state: Embedded,  # the family's `embed` of every row
    run_blocks: RunBlocks,
    samples: Sequence[CachedSample],
    *,
    may_gather: bool,
) -> tuple[torch.Tensor, list[bool]]:
    """The image tokens after every block [1, image tokens, dim] and which samples skipped."""
    model = transformer
    first = run_blocks(model.transformer_blocks[:1], (), state, layout)
    features = first_block_features(state.image, first.image, layout.image)
    rest = (model.transformer_blocks[1:], model.single_transformer_blocks)

    def run_rest(rows: Sequence[int] | None, image: torch.Tensor) -> torch.Tensor:
        if rows is None:
            return run_blocks(*rest, first, layout).image
        part = Embedded(image, first.text[rows], first.temb[rows])
        return run_blocks(*rest, part, layout.select(rows)).image

    return cached_blocks(samples, features, first.image, layout.image, run_rest, may_gather=may_gather)
