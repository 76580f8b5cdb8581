"""One group's denoiser input, gathered from its samples' rows.

Row layout: samples in group order, each with the rows its adapter gave it (for CFG
families [uncond, cond] or one row). Every row carries its own timestep, so samples at
different steps (and with different samplers) share the forward. The conditioning
buffers are refilled only when the group's membership changes; latents and timesteps
are rewritten every step into the same buffers. A conditioning tensor whose first
dimension differs between rows (Z-Image's per-token text features) is zero-padded,
and each row's true length is kept in `ForwardBatch.lengths`.

With `row_buckets` set, a forward of uniform size carries the smallest bucket's rows that
holds its samples, the extra ones being the adapter's padding row. Deterministic mode has one
bucket, the most rows a group can have: a row's result no longer depends on how many other
samples happen to run, so outputs are bit-identical alone and batched. A compiled denoiser
(`batching.denoiser_compile`) has a few, one compiled shape each. Groups that mix sizes are
never padded (their rows' latents differ in shape).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batching.host_copy import to_device
from batching.pipelines.contract import Conditioning, ForwardBatch, PipelineAdapter
from batching.sample_tensors import SampleTensors


class InputBatch:
    def __init__(self, adapter: PipelineAdapter, *, row_buckets: Sequence[int] | None = None) -> None:
        self.adapter = adapter
        self.row_buckets = tuple(sorted(row_buckets)) if row_buckets else None  # padded row counts; None: unpadded
        self.sample_ids: tuple[str, ...] = ()  # membership the conditioning buffers were filled for
        self.num_rows = 0  # real rows, padding excluded
        self.latents: torch.Tensor | None = None  # [num_buffer_rows, *latent_shape]; None when sizes differ
        self.timesteps: torch.Tensor | None = None  # [num_buffer_rows]
        self.conditioning: dict[str, torch.Tensor] = {}  # name -> [num_buffer_rows, *shape]
        self.lengths: dict[str, list[int]] = {}  # name -> each buffer row's true first-dim length

    def prepare(self, samples: Sequence[SampleTensors]) -> ForwardBatch:
        """Fill the buffers for this step, padding rows included."""
        sample_ids = tuple(sample.sample_id for sample in samples)
        if sample_ids != self.sample_ids:
            self._refill_conditioning(samples)
            self.sample_ids = sample_ids
        assert self.timesteps is not None  # the first prepare fills the buffers
        row = 0
        mixed_latents: list[torch.Tensor] = []
        timesteps: list[torch.Tensor] = []  # each row's, as 0-dim host tensors
        for sample in samples:
            model_input = self.adapter.model_input(sample)  # [1, *latent_shape]
            if self.latents is None:
                mixed_latents += [model_input[0]] * sample.num_rows
            else:
                self.latents[row : row + sample.num_rows] = model_input  # broadcast over the sample's rows
            timesteps += [sample.host_timestep] * sample.num_rows
            row += sample.num_rows
        self.timesteps[:row].copy_(to_device(timesteps, self.timesteps.device), non_blocking=True)  # one copy
        return ForwardBatch(
            self.latents if self.latents is not None else mixed_latents,
            self.timesteps,
            self.conditioning,
            self.lengths,
            num_real_rows=self.num_rows if self.row_buckets is not None else None,
            membership=sample_ids,
        )

    def _refill_conditioning(self, samples: Sequence[SampleTensors]) -> None:
        self.num_rows = sum(sample.num_rows for sample in samples)
        latents = samples[0].latents
        is_uniform = all(sample.latents.shape == latents.shape for sample in samples)
        num_buffer_rows = self._bucket(self.num_rows) if is_uniform else self.num_rows
        rows: list[Conditioning] = [row for sample in samples for row in sample.row_conditioning]
        if num_buffer_rows > self.num_rows:
            rows += [self.adapter.padding_row(samples[0].params)] * (num_buffer_rows - self.num_rows)
        if is_uniform:
            self.latents = self._reuse(self.latents, (num_buffer_rows, *latents.shape[1:]), latents.dtype)
            self.latents[self.num_rows :] = 0
        else:  # a family that mixes sizes: one latent per row, gathered every step (deterministic mode keeps the
            self.latents = None  # size in the key: its groups are uniform)
        self.timesteps = self._reuse(self.timesteps, (num_buffer_rows,), torch.float32)
        self.timesteps[self.num_rows :] = 0
        self.lengths = {}
        for name, first in rows[0].items():
            tensors = [row[name] for row in rows]
            lengths = [tensor.shape[0] if tensor.dim() else 0 for tensor in tensors]
            shape = (num_buffer_rows, max(lengths), *first.shape[1:]) if first.dim() else (num_buffer_rows,)
            buffer = self._reuse(self.conditioning.get(name), shape, first.dtype)
            if len(set(lengths)) > 1:
                buffer.zero_()
                self.lengths[name] = lengths
            for index, tensor in enumerate(tensors):
                if tensor.dim():
                    buffer[index, : lengths[index]] = tensor  # shorter rows stay zero-padded
                else:
                    buffer[index] = tensor
            self.conditioning[name] = buffer

    def _bucket(self, num_rows: int) -> int:
        """The rows a forward of `num_rows` real rows carries: the smallest bucket that holds them."""
        if self.row_buckets is None:
            return num_rows
        return next((bucket for bucket in self.row_buckets if bucket >= num_rows), num_rows)

    def _reuse(self, buffer: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if buffer is not None and buffer.shape == shape and buffer.dtype == dtype:
            return buffer
        return torch.zeros(shape, device=self.adapter.device, dtype=dtype)
