"""The step cache of the Z-Image transformer, decided per sample inside one forward.

The packed forward (`zimage.packed`) split where the cache decides: the refiners (image tokens,
caption tokens) run on every row (but a caching sample refines its caption once: no timestep
modulates it, `_refined_captions`); each caching sample's early feature is compared with the one at
its last full step (`step_cache_rows.cached_blocks`); the main blocks run only on the rows of samples that
compute, packed on their own (`ZImageLayout.select_unified`); a sample that skips adds the residual
those blocks added at its last full step.

The early feature is TeaCache's, the first main block's timestep-modulated input
(`NUM_BLOCKS_KEPT = 0`: a skip saves every main block). First-Block Cache (`NUM_BLOCKS_KEPT
= 1`: block 0 runs on every row, its residual decides, a skip saves the others) drew worse
for the same number of block evaluations on builtin:shapes-dit (docs/benchmarks.md, step
caching), so it is kept only as the measured alternative. The final layer (modulated by each
row's own timestep) and unpatchify run on every row. The calls are the model's own
submodules and helpers, so with nothing skipped the result is the model's forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batching.pipelines.contract import CachedSample
from batching.pipelines.step_cache_rows import cached_blocks, first_block_features, sample_rows
from batching.pipelines.zimage import packed
from batching.pipelines.zimage.packed import ZImageLayout

NUM_BLOCKS_KEPT = 0  # main blocks every row runs: 0 (TeaCache's feature) or 1 (First-Block Cache), see above


def residual_cached_forward(
    transformer: Any,
    layout: ZImageLayout,
    latents: Sequence[torch.Tensor],  # per row [c, 1, h, w]
    t: torch.Tensor,  # [rows], the transformer's time in [0, 1]
    captions: Sequence[torch.Tensor],  # per row [tokens_i, cap_feat_dim]
    samples: Sequence[CachedSample],
    *,
    may_gather: bool,
) -> tuple[list[torch.Tensor], list[bool]]:
    """The transformer's output (per row [c, 1, h, w]) and which samples skipped."""
    model = transformer
    state = packed.embed(model, layout, latents, t, captions)
    unified = packed.unify(layout, state.image, _refined_captions(model, layout, state.captions, samples, may_gather))
    all_rows, freqs = layout.unified.segments, layout.unified_freqs
    first = packed.run_layers(model.layers[:NUM_BLOCKS_KEPT], unified, all_rows, freqs, state.adaln)
    if NUM_BLOCKS_KEPT:
        features = first_block_features(unified, first, all_rows)
    else:  # TeaCache's early feature: the first block's timestep-modulated input
        block = model.layers[0]
        scale_msa = packed.modulated_input_scales(block, state.adaln, all_rows)[0]
        features = all_rows.split((block.attention_norm1(unified) * scale_msa)[0])  # per row [seq_i, dim]
    rest = model.layers[NUM_BLOCKS_KEPT:]

    def run_rest(rows: Sequence[int] | None, x: torch.Tensor) -> torch.Tensor:
        if rows is None:
            return packed.run_layers(rest, x, all_rows, freqs, state.adaln)
        segments, _, part_freqs = layout.select_unified(rows)
        return packed.run_layers(rest, x, segments, part_freqs, state.adaln[rows])

    hidden, skipped = cached_blocks(samples, features, first, all_rows, run_rest, may_gather=may_gather)
    return packed.output(model, layout, hidden, state.adaln), skipped


def _refined_captions(
    model: Any, layout: ZImageLayout, captions: torch.Tensor, samples: Sequence[CachedSample], may_gather: bool
) -> torch.Tensor:
    """The captions [1, caption tokens, dim] after the context refiner. No timestep modulates it, so a caching
    sample keeps its rows' result from its first step (`StepCacheState.constant`) and later steps refine only the
    other rows."""
    constants: list[torch.Tensor | None] = []  # per row
    for sample in samples:
        kept = sample.state.constant if sample.state is not None and may_gather else None
        constants += kept if kept is not None else [None] * sample.num_rows
    constants += [None] * (layout.captions.num_rows - len(constants))  # deterministic padding rows
    rows = [row for row, constant in enumerate(constants) if constant is None]
    refined = packed.refine_captions(model, layout, captions, rows) if rows else captions.clone()
    views = layout.captions.split(refined[0])
    for row, constant in enumerate(constants):
        if constant is not None:
            views[row].copy_(constant)
    for sample, sample_row_range in zip(samples, sample_rows(samples)):
        if sample.state is not None and sample.state.constant is None:
            sample.state.constant = [views[row].clone() for row in sample_row_range]
    return refined
