"""What every family's step cache shares: the per-sample decision and the rows that compute.

The decision (`decide`) compares each caching sample's early feature, row by row, with the
same rows at its last full step: the relative L1 change summed over the sample's rows, so a
CFG sample's two rows skip or compute together. A sample that computes takes its feature as
the new reference (`keep`). The adapter decides where its family's early feature is, and what a skip
reuses (`core.step_cache`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from batching.pipelines.contract import CachedSample
from batching.pipelines.packing import Segments


def decide(samples: Sequence[CachedSample], features: Sequence[torch.Tensor]) -> list[bool]:
    """Whether each sample skips this step, from `features` (per row of the batch, in order: that row's early
    feature, the same shape at every step). Changes no state: `keep` does, once the forward succeeded (an
    out-of-memory retry decides again from the same state)."""
    changes = relative_changes(samples, features)
    return [
        change is not None and change < sample.state.threshold  # type: ignore[union-attr]
        for sample, change in zip(samples, changes)
    ]


def relative_changes(samples: Sequence[CachedSample], features: Sequence[torch.Tensor]) -> list[float | None]:
    """Per sample: the relative L1 change of its rows' features since its last full step; None for a sample
    that computes regardless (no cache, its first or last step, no full step yet)."""
    changes: list[torch.Tensor] = []  # one 0-d tensor per sample that may skip
    row = 0
    for sample in samples:
        state = sample.state
        if _is_candidate(sample):
            assert state is not None and state.reference is not None
            rows = features[row : row + sample.num_rows]
            difference = sum((now.float() - then.float()).abs().sum() for now, then in zip(rows, state.reference))
            size = sum(then.float().abs().sum() for then in state.reference)
            changes.append(torch.as_tensor(difference / size))
        row += sample.num_rows
    values = iter(torch.stack(changes).tolist() if changes else [])  # one device sync per forward
    return [next(values) if _is_candidate(sample) else None for sample in samples]


def keep(
    samples: Sequence[CachedSample],
    skipped: Sequence[bool],
    features: Sequence[torch.Tensor],
    skippable_outputs: Sequence[torch.Tensor | None],
) -> None:
    """After the forward: each caching sample that computed keeps, per row, its early feature (the reference
    of its next decisions) and what the skippable part produced (`skippable_outputs`, per row of the batch)."""
    for sample, rows, is_skip in zip(samples, sample_rows(samples), skipped):
        if sample.state is None or is_skip:
            continue
        sample.state.reference = [features[row].clone() for row in rows]
        sample.state.cached = [skippable_outputs[row].clone() for row in rows]  # type: ignore[union-attr]


def _is_candidate(sample: CachedSample) -> bool:
    state = sample.state
    return state is not None and sample.may_skip and state.reference is not None and state.cached is not None


def rows_to_run(samples: Sequence[CachedSample], skipped: Sequence[bool], num_rows: int, may_gather: bool) -> list[int]:
    """The batch rows that run the skippable part: those that compute (`computing_rows`), gathered into a smaller
    batch with `may_gather`; without it, every row as soon as one computes (each row's arithmetic keeps the batch
    size: deterministic mode, per-row LoRA adapters). Empty when every sample skips."""
    rows = computing_rows(samples, skipped, num_rows)
    if rows and not (may_gather and len(rows) < num_rows):
        return list(range(num_rows))
    return rows


def first_block_features(before: torch.Tensor, after: torch.Tensor, rows: Segments) -> list[torch.Tensor]:
    """First-Block Cache's early feature: per row [tokens_i, dim], what the first block added to its tokens (`before`
    and `after` it: [1, tokens, dim], packed as `rows`)."""
    return [now - then for now, then in zip(rows.split(after[0]), rows.split(before[0]))]


def cached_blocks(
    samples: Sequence[CachedSample],
    features: Sequence[torch.Tensor],
    hidden: torch.Tensor,  # [1, tokens, dim]: every row's tokens before the skippable blocks, packed
    rows: Segments,  # each row's tokens in `hidden`
    run: Callable[[Sequence[int] | None, torch.Tensor], torch.Tensor],
    *,
    may_gather: bool,
) -> tuple[torch.Tensor, list[bool]]:
    """Residual caching over a packed stream, what every transformer family's step cache does after its early
    feature (`features`, per row): decide per sample, run the skippable blocks (`run(rows, their tokens)`, rows
    None: every row, the forward's own layout) only on the rows that compute, packed on their own, and give the
    rows of a sample that skips their tokens plus the residual those blocks added at its last full step
    (`reuse_residuals`). The tokens after the skippable blocks [1, tokens, dim] and which samples skipped."""
    skipped = decide(samples, features)
    computing = rows_to_run(samples, skipped, rows.num_rows, may_gather)
    if len(computing) == rows.num_rows:
        after = run(None, hidden)
    else:
        after = hidden.clone()  # the rows that compute filled in below, those that skip by reuse_residuals
        if computing:
            index = rows.token_index(computing)
            after[:, index] = run(computing, hidden[:, index])
    reuse_residuals(samples, skipped, features, rows.split(hidden[0]), rows.split(after[0]))
    return after, skipped


def reuse_residuals(
    samples: Sequence[CachedSample],
    skipped: Sequence[bool],
    features: Sequence[torch.Tensor],
    before: Sequence[torch.Tensor],
    after: Sequence[torch.Tensor],
) -> None:
    """Residual caching (FLUX.1's First-Block Cache, Z-Image's): `before` and `after` are each row's own tokens
    [tokens_i, dim] around the skippable blocks (views into the packed forward). The rows of a sample that skips
    get `before` plus the residual those blocks added at its last full step (written into `after`, in place); a
    caching sample that computed keeps its feature and its new residual."""
    residuals: list[torch.Tensor | None] = [None] * len(before)  # per row: what the skippable blocks added
    for sample, rows, is_skip in zip(samples, sample_rows(samples), skipped):
        for index_in_sample, row in enumerate(rows):
            if is_skip:
                assert sample.state is not None and sample.state.cached is not None
                after[row].copy_(before[row] + sample.state.cached[index_in_sample])
            elif sample.state is not None:
                residuals[row] = after[row] - before[row]
    keep(samples, skipped, features, residuals)


def computing_rows(samples: Sequence[CachedSample], skipped: Sequence[bool], num_rows: int) -> list[int]:
    """Indices of the batch rows that compute: those of samples that do not skip, and any padding rows after
    the samples' (deterministic mode)."""
    rows: list[int] = []
    row = 0
    for sample, is_skip in zip(samples, skipped):
        if not is_skip:
            rows += range(row, row + sample.num_rows)
        row += sample.num_rows
    return rows + list(range(row, num_rows))


def sample_rows(samples: Sequence[CachedSample]) -> list[range]:
    """Each sample's row indices in the batch."""
    ranges, row = [], 0
    for sample in samples:
        ranges.append(range(row, row + sample.num_rows))
        row += sample.num_rows
    return ranges
