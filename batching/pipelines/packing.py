"""Rows of different lengths in one transformer forward, packed into one token sequence: no padding position.

In a DiT every layer but attention works per token (projections, MLPs, norms) or per row (the
timestep and guidance embedding that modulates a row's tokens). So rows whose token counts differ
(image sizes, frame counts, prompt lengths, reference or edit images) share a forward when their
tokens are concatenated into one sequence, [1, tokens, dim], with each row's offset kept
(`Segments`, the `cu_seqlens` of FlashAttention's varlen kernels): the token-wise layers run once
over all of them, a row's modulation is expanded to its own tokens (`Segments.per_token`), and
attention runs per segment (`batching.pipelines.packed_attention`), so rows never meet. A row's
tokens compute what they compute alone; nothing is computed for a position that is no row's.

A forward has one `Segments` per stream (FLUX's image tokens; its joint text-and-image sequence;
Z-Image's captions), and `Joint` lays two or more streams out row by row ([text_0 | image_0 |
text_1 | image_1 ...]) for a joint attention or a single-stream block. Rotary positions stay per
row: a family builds each row's table and packs them like the tokens. A row's image stream may hold
several parts (its own latents, then an edit image's or reference images' latents): the family
concatenates them per row before packing, and its layout knows each part's length.

Per-row LoRA adapters (`batching.lora.row_deltas`) find each packed token's row through the stream
the forward marks as current (`Segments.lora_tokens`): a LoRA layer whose input's first dimension
is the forward's row count is in row mode (a modulation linear), any other input is the current
stream's tokens.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch


@dataclass(eq=False)
class Segments:
    """Where each row's tokens lie in one packed stream: row r's are [starts[r], starts[r] + lengths[r])."""

    lengths: tuple[int, ...]
    device: torch.device
    cu_seqlens: torch.Tensor = field(init=False)  # [rows + 1] int32: each row's start, then the total
    row_of_token: torch.Tensor = field(init=False)  # [tokens] int64: the row each token belongs to
    starts: tuple[int, ...] = field(init=False)
    lengths_tensor: torch.Tensor = field(init=False)  # [rows] int64: `lengths` on the device
    _token_indices: dict[tuple[int, ...], torch.Tensor] = field(init=False, default_factory=dict)
    _selections: dict[tuple[int, ...], Segments] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        offsets = [0]
        for length in self.lengths:
            offsets.append(offsets[-1] + length)
        self.starts = tuple(offsets[:-1])
        self.cu_seqlens = device_tensor(offsets, torch.int32, self.device)
        self.lengths_tensor = device_tensor(self.lengths, torch.int64, self.device)
        rows = torch.arange(len(self.lengths), device=self.device)
        self.row_of_token = rows.repeat_interleave(self.lengths_tensor, output_size=offsets[-1])

    @property
    def num_rows(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def max_length(self) -> int:
        return max(self.lengths)

    @property
    def is_uniform(self) -> bool:
        """Every row has as many tokens (attention may then run as one batch of equal rows)."""
        return len(set(self.lengths)) == 1

    def per_token(self, per_row: torch.Tensor) -> torch.Tensor:
        """[rows, ...] values (a row's modulation) -> [tokens, ...]: each token gets its row's."""
        return per_row.index_select(0, self.row_of_token)

    def split(self, tokens: torch.Tensor, dim: int = 0) -> list[torch.Tensor]:
        """Packed [..., tokens, ...] (tokens on `dim`) -> each row's own, as views."""
        return list(tokens.split(list(self.lengths), dim=dim))

    def select(self, rows: Sequence[int]) -> tuple[Segments, torch.Tensor]:
        """The segments of `rows` packed on their own, and the indices of their tokens in this stream (both kept
        per row set)."""
        key = tuple(rows)
        if key not in self._selections:
            self._selections[key] = Segments(tuple(self.lengths[row] for row in key), self.device)
        return self._selections[key], self.token_index(key)

    def row_lengths(self, rows: Sequence[int]) -> torch.Tensor:
        """[n] int64 on the device: the token counts of `rows` (kept per row set)."""
        return self.select(rows)[0].lengths_tensor

    def token_index(self, rows: Sequence[int]) -> torch.Tensor:
        """[n] int64: the positions of `rows`' tokens in this stream, in row order (kept per row set)."""
        key = tuple(rows)
        index = self._token_indices.get(key)
        if index is None:
            positions = [i for row in key for i in range(self.starts[row], self.starts[row] + self.lengths[row])]
            index = device_tensor(positions, torch.int64, self.device)
            self._token_indices[key] = index
        return index

    @contextlib.contextmanager
    def lora_tokens(self) -> Iterator[None]:
        """Within the block, a per-row LoRA layer's packed input is this stream's tokens (module docstring)."""
        previous = _current.segments
        _current.segments = self
        try:
            yield
        finally:
            _current.segments = previous


class _Current(threading.local):
    segments: Segments | None = None


_current = _Current()


def device_tensor(values: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` as a tensor on `device`, copied from pinned memory on CUDA: the copy is queued without waiting for
    the device (a copy from ordinary host memory would wait for every kernel queued before it)."""
    tensor = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def current_lora_tokens() -> Segments | None:
    """The packed stream a per-row LoRA layer's input belongs to in this thread's forward (None: not packed)."""
    return _current.segments


@dataclass(eq=False)
class Joint:
    """Two or more streams laid out row by row: row r's sequence is its segment of each stream, in order."""

    streams: tuple[Segments, ...]
    segments: Segments = field(init=False)  # of the joint sequence
    order: torch.Tensor = field(init=False)  # [tokens] int64: joint position -> position in the streams' concatenation
    inverse: torch.Tensor = field(init=False)  # [tokens] int64: the concatenation's position -> joint position

    def __post_init__(self) -> None:
        first = self.streams[0]
        assert all(stream.num_rows == first.num_rows for stream in self.streams)
        lengths = tuple(sum(stream.lengths[row] for stream in self.streams) for row in range(first.num_rows))
        self.segments = Segments(lengths, first.device)
        bases, base = [], 0
        for stream in self.streams:
            bases.append(base)
            base += stream.num_tokens
        order = [
            i
            for row in range(first.num_rows)
            for stream, offset in zip(self.streams, bases)
            for i in range(offset + stream.starts[row], offset + stream.starts[row] + stream.lengths[row])
        ]
        self.order = device_tensor(order, torch.int64, first.device)
        self.inverse = torch.empty_like(self.order)
        self.inverse[self.order] = torch.arange(len(order), device=first.device)

    def join(self, *parts: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Each stream's packed tensor (tokens on `dim`) -> the joint sequence's."""
        return torch.cat(parts, dim=dim).index_select(dim, self.order)

    def unjoin(self, joint: torch.Tensor, dim: int = 0) -> list[torch.Tensor]:
        """The joint sequence's tensor -> each stream's packed tensor, in the stream's own order."""
        return list(joint.index_select(dim, self.inverse).split([s.num_tokens for s in self.streams], dim=dim))


def modulation(per_row: torch.Tensor, rows: Segments | None, num_chunks: int) -> tuple[torch.Tensor, ...]:
    """Each row's modulation [rows, num_chunks * dim] laid over its tokens, in `num_chunks` chunks: [1, tokens, dim]
    over a packed stream, or [rows, 1, dim] (`rows` None) over rows of equal length, [rows, tokens, dim]."""
    laid = per_row[:, None] if rows is None else rows.per_token(per_row)[None]
    return laid.chunk(num_chunks, dim=-1)


def continuous_norm(norm: Any, x: torch.Tensor, emb: torch.Tensor, rows: Segments | None) -> torch.Tensor:
    """diffusers' `AdaLayerNormContinuous` (the output norm of FLUX, SD3, Qwen-Image) with each row's (scale, shift)
    laid over its tokens of `x` ([1, tokens, dim] over packed `rows`, or [rows, tokens, dim] with `rows` None)."""
    scale, shift = modulation(norm.linear(norm.silu(emb).to(x.dtype)), rows, 2)
    return norm.norm(x) * (1 + scale) + shift


Layout = TypeVar("Layout")


class LayoutCache(Generic[Layout]):
    """The last few forwards' layouts (segments, rotary tables), reused while their rows stay the same
    (`ForwardBatch.membership`: their conditioning, positions included, is fixed for a sample's life). A group's
    membership changes far less often than every step, building a layout reads the rows' positions off the
    device, and an engine may run a few groups (or chunks of one) in turn."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._layouts: OrderedDict[Hashable, Layout] = OrderedDict()

    def get(self, key: Hashable | None, build: Callable[[], Layout]) -> Layout:
        """The layout for `key`; None (rows of unknown identity): built afresh and not kept."""
        if key is None:
            return build()
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = build()
            if len(self._layouts) > self.size:
                self._layouts.popitem(last=False)
        self._layouts.move_to_end(key)
        return layout
