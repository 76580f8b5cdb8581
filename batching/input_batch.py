"""One group's denoiser input, gathered from its jobs, and the prediction scattered back.

Row layout: jobs in group order; a guided job owns two rows [uncond, cond], an
unguided job one row. Every row carries its own timestep, so jobs at different steps
(and with different samplers) share the forward. The embedding buffer is refilled
only when the group's membership changes; latents and timesteps are rewritten every
step into the same buffers.

With `num_padded_rows` set (deterministic mode) every forward carries exactly that many
rows: the padding rows are zeros, and a row's result no longer depends on how many
other jobs happen to run, so outputs are bit-identical alone and batched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batching.sample_tensors import SampleTensors


class InputBatch:
    def __init__(self, *, device: torch.device, dtype: torch.dtype, num_padded_rows: int | None = None) -> None:
        self.device = device
        self.dtype = dtype
        self.num_padded_rows = num_padded_rows
        self.job_ids: tuple[str, ...] = ()  # membership the embedding buffer was filled for
        self.num_rows = 0  # real rows, padding excluded
        self.latents: torch.Tensor | None = None  # [num_buffer_rows, c, h, w]
        self.timesteps: torch.Tensor | None = None  # [num_buffer_rows]
        self.embeds: torch.Tensor | None = None  # [num_buffer_rows, seq, dim]

    def prepare(self, jobs: Sequence[SampleTensors]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Fill the buffers for this step: (latents, timesteps, embeds), padding included."""
        job_ids = tuple(job.job_id for job in jobs)
        if job_ids != self.job_ids:
            self._refill_embeds(jobs)
            self.job_ids = job_ids
        row = 0
        for job in jobs:
            timestep = job.timestep
            model_input = job.sampler.scale_model_input(job.latents, timestep)  # [1, c, h, w]
            self.latents[row : row + job.num_rows] = model_input
            self.timesteps[row : row + job.num_rows] = timestep
            row += job.num_rows
        num_used = self.num_padded_rows or self.num_rows
        return self.latents[:num_used], self.timesteps[:num_used], self.embeds[:num_used]

    def guided_predictions(self, noise_pred: torch.Tensor, jobs: Sequence[SampleTensors]) -> list[torch.Tensor]:
        """Each job's prediction [1, c, h, w], with its own guidance scale applied."""
        predictions = []
        row = 0
        for job in jobs:
            if job.has_guidance:
                uncond, cond = noise_pred[row : row + 1], noise_pred[row + 1 : row + 2]
                predictions.append(uncond + job.params.guidance_scale * (cond - uncond))
            else:
                predictions.append(noise_pred[row : row + 1])
            row += job.num_rows
        return predictions

    def _refill_embeds(self, jobs: Sequence[SampleTensors]) -> None:
        self.num_rows = sum(job.num_rows for job in jobs)
        num_buffer_rows = self.num_padded_rows or self.num_rows
        assert self.num_rows <= num_buffer_rows, f"{self.num_rows} rows exceed the fixed row count {num_buffer_rows}"
        latent_shape = jobs[0].latents.shape[1:]
        seq_len = max(job.cond_embeds.shape[0] for job in jobs)
        embed_dim = jobs[0].cond_embeds.shape[1]
        self.latents = self._reuse(self.latents, (num_buffer_rows, *latent_shape))
        self.timesteps = self._reuse(self.timesteps, (num_buffer_rows,), dtype=torch.float32)
        self.embeds = self._reuse(self.embeds, (num_buffer_rows, seq_len, embed_dim))
        self.embeds.zero_()
        row = 0
        for job in jobs:
            rows = [job.uncond_embeds, job.cond_embeds] if job.has_guidance else [job.cond_embeds]
            for embeds in rows:
                self.embeds[row, : embeds.shape[0]] = embeds  # shorter prompts are zero-padded
                row += 1
        if self.num_padded_rows:
            self.latents[self.num_rows :] = 0
            self.timesteps[self.num_rows :] = 0

    def _reuse(self, buffer: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = dtype or self.dtype
        if buffer is not None and buffer.shape == shape and buffer.dtype == dtype:
            return buffer
        return torch.zeros(shape, device=self.device, dtype=dtype)
