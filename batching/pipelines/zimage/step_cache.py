"""The step cache of the Z-Image transformer, decided per sample inside one forward.

`ZImageTransformer2DModel.forward` in its basic (non-omni) mode, split where the cache
decides: the refiners (image tokens, caption tokens) run on every row (but a caching sample
refines its caption once: no timestep modulates it, `_refined_captions`); each caching sample's
early feature is compared with the one at its last full step (`step_cache_rows.decide`); the
main blocks run only on the rows of samples that compute, gathered into a smaller padded
batch (its own attention mask, trimmed to its longest row); a sample that skips adds the
residual those blocks added at its last full step.

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
from batching.pipelines.mixed_sizes import padding_mask
from batching.pipelines.step_cache_rows import decide, reuse_residuals, rows_to_run, sample_rows

PATCH_SIZE, F_PATCH_SIZE = 2, 1  # what ZImageAdapter.forward passes (the transformer's defaults)
NUM_BLOCKS_KEPT = 0  # main blocks every row runs: 0 (TeaCache's feature) or 1 (First-Block Cache), see above


def residual_cached_forward(
    transformer: Any,
    latents: list[torch.Tensor],  # per row [c, 1, h, w]
    t: torch.Tensor,  # [rows], the transformer's time in [0, 1]
    captions: list[torch.Tensor],  # per row [tokens_i, cap_feat_dim]
    samples: Sequence[CachedSample],
    *,
    may_gather: bool,
) -> tuple[list[torch.Tensor], list[bool]]:
    """The transformer's output (per row [c, 1, h, w]) and which samples skipped."""
    model = transformer
    device = latents[0].device
    patch = f"{PATCH_SIZE}-{F_PATCH_SIZE}"
    adaln_input = model.t_embedder(t * model.t_scale).type_as(latents[0])  # [rows, adaln_dim]
    x, cap_feats, x_size, x_pos_ids, cap_pos_ids, x_pad_mask, cap_pad_mask = model.patchify_and_embed(
        latents, captions, PATCH_SIZE, F_PATCH_SIZE
    )
    x_seqlens = [len(row) for row in x]
    x = model.all_x_embedder[patch](torch.cat(x, dim=0))
    x, x_freqs, x_mask, _, _ = model._prepare_sequence(
        list(x.split(x_seqlens, dim=0)), x_pos_ids, x_pad_mask, model.x_pad_token, None, device
    )
    for layer in model.noise_refiner:
        x = layer(x, x_mask, x_freqs, adaln_input)
    cap_seqlens = [len(row) for row in cap_feats]
    cap_feats = model.cap_embedder(torch.cat(cap_feats, dim=0))
    cap_feats, cap_freqs, cap_mask, _, _ = model._prepare_sequence(
        list(cap_feats.split(cap_seqlens, dim=0)), cap_pos_ids, cap_pad_mask, model.cap_pad_token, None, device
    )
    cap_feats = _refined_captions(model, cap_feats, cap_freqs, cap_mask, cap_seqlens, samples, may_gather)
    unified, freqs, mask, _ = model._build_unified_sequence(
        x, x_freqs, x_seqlens, None, cap_feats, cap_freqs, cap_seqlens, None, None, None, None, None, False, device
    )  # [rows, max_seq, dim]
    seqlens = [a + b for a, b in zip(x_seqlens, cap_seqlens)]  # each row's real tokens: [image, caption]

    first = unified
    for layer in model.layers[:NUM_BLOCKS_KEPT]:
        first = layer(first, mask, freqs, adaln_input)  # [rows, max_seq, dim]
    if NUM_BLOCKS_KEPT:
        features = [first[row, :n] - unified[row, :n] for row, n in enumerate(seqlens)]  # per row [seq_i, dim]
    else:  # TeaCache's early feature: the first block's timestep-modulated input
        block = model.layers[0]
        scale_msa = 1.0 + block.adaLN_modulation(adaln_input)[:, : block.dim].unsqueeze(1)  # [rows, 1, dim]
        modulated = block.attention_norm1(unified) * scale_msa
        features = [modulated[row, :n] for row, n in enumerate(seqlens)]
    skipped = decide(samples, features)
    rows = rows_to_run(samples, skipped, len(seqlens), may_gather)
    hidden = first.clone()  # [rows, max_seq, dim]: the last block's output, filled in below
    if rows:
        part, part_freqs, part_mask = _gathered(rows, seqlens, first, freqs, mask)  # [computing rows, width, dim]
        part_adaln = adaln_input if len(rows) == len(seqlens) else adaln_input[rows]
        for layer in model.layers[NUM_BLOCKS_KEPT:]:
            part = layer(part, part_mask, part_freqs, part_adaln)
        hidden[rows, : part.shape[1]] = part
    reuse_residuals(samples, skipped, features, first, hidden, seqlens)
    out = model.all_final_layer[patch](hidden, c=adaln_input)
    return model.unpatchify(list(out.unbind(dim=0)), x_size, PATCH_SIZE, F_PATCH_SIZE), skipped


def _refined_captions(
    model: Any,
    cap_feats: torch.Tensor,  # [rows, max caption tokens, dim], embedded
    cap_freqs: torch.Tensor,
    cap_mask: torch.Tensor | None,
    cap_seqlens: list[int],
    samples: Sequence[CachedSample],
    may_gather: bool,
) -> torch.Tensor:
    """The captions after the context refiner. No timestep modulates it, so a caching sample keeps its rows'
    result from its first step (`StepCacheState.constant`) and later steps refine only the other rows."""
    constants: list[torch.Tensor | None] = []  # per row
    for sample in samples:
        kept = sample.state.constant if sample.state is not None and may_gather else None
        constants += kept if kept is not None else [None] * sample.num_rows
    constants += [None] * (len(cap_seqlens) - len(constants))  # deterministic padding rows
    rows = [row for row, constant in enumerate(constants) if constant is None]
    if rows:
        part, part_freqs, part_mask = _gathered(rows, cap_seqlens, cap_feats, cap_freqs, cap_mask)
        for layer in model.context_refiner:
            part = layer(part, part_mask, part_freqs)
        cap_feats = cap_feats.clone()
        cap_feats[rows, : part.shape[1]] = part
    for row, constant in enumerate(constants):
        if constant is not None:
            cap_feats[row, : cap_seqlens[row]] = constant
    for sample, sample_row_range in zip(samples, sample_rows(samples)):
        if sample.state is not None and sample.state.constant is None:
            sample.state.constant = [cap_feats[row, : cap_seqlens[row]].clone() for row in sample_row_range]
    return cap_feats


def _gathered(
    rows: list[int], seqlens: list[int], tokens: torch.Tensor, freqs: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The `rows` of a padded sequence batch (its tokens and rotary tables [rows, width, ...], and its key mask),
    trimmed to their longest row: the batch as it is when `rows` are all its rows."""
    if len(rows) == len(seqlens):
        return tokens, freqs, mask
    width = max(seqlens[row] for row in rows)
    index = torch.tensor(rows, device=tokens.device)
    return tokens[index, :width], freqs[index, :width], _mask([seqlens[row] for row in rows], width, tokens.device)


def _mask(seqlens: list[int], width: int, device: torch.device) -> torch.Tensor | None:
    """The key mask of rows padded to `width` (None when none is padded, as the model builds it)."""
    return None if all(n == width for n in seqlens) else padding_mask(seqlens, width, device)
