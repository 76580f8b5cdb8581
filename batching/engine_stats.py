"""Counters the engine loop keeps for `DiffusionEngine.stats()`; plain numbers only.

The `jobs_*` names of the stats keys count samples (images); they are kept because
workers publish them (metrics, heartbeats) under these names. `jobs_finished`, `jobs_failed`,
`jobs_canceled` and `jobs_aborted` are counted where a job ends (its one exit, batching.job_book):
each counts the images of the jobs that ended so, once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from batching.job import Ending
from batching.plan import RunnerOutput

if TYPE_CHECKING:
    from batching.decoder import DecodeResult


@dataclass(slots=True)
class EngineStats:
    num_iterations: int = 0  # engine steps that ran at least one forward or freed state
    num_forwards: int = 0
    rows_per_forward: Counter = field(default_factory=Counter)  # rows (padding excluded) -> forwards
    samples_per_forward: Counter = field(default_factory=Counter)  # samples -> forwards
    sizes_per_forward: Counter = field(default_factory=Counter)  # distinct image sizes in a forward -> forwards
    loras_per_forward: Counter = field(default_factory=Counter)  # distinct LoRA adapters in a forward -> forwards
    num_sample_steps: int = 0  # denoise steps taken, summed over samples
    num_samples_ended: Counter = field(default_factory=Counter)  # Ending -> images of the jobs that ended so
    busy_seconds: float = 0.0  # wall time spent inside iterations that did work
    forward_seconds: float = 0.0  # denoiser forwards (device time on CUDA, read from events without waiting)
    decode_seconds: float = 0.0  # decode batches (on the decode worker when decode overlaps the loop)
    encode_seconds: float = 0.0  # starting new samples: prompt and init-image encoding (on the encode worker when
    # encoding overlaps the loop)
    num_oom_splits: int = 0  # out-of-memory errors answered by splitting a forward or a decode batch
    num_cache_blocks: int = 0  # step cache: block evaluations full forwards would have run (per row)
    num_cache_blocks_skipped: int = 0  # of those, skipped by samples reusing their step cache
    num_cache_steps_skipped: int = 0  # sample steps that reused their step cache
    num_tokens_computed: int = 0  # denoiser sequence positions computed, all rows, text tokens included
    num_tokens_padded: int = 0  # of those, positions of no sample's own: padding that equalises rows' lengths (none
    # where rows are packed), deterministic mode's padding rows (docs/families.md, "Mixed sizes")

    def record(self, output: RunnerOutput, seconds: float) -> None:
        self.num_iterations += 1
        self.busy_seconds += seconds
        self.num_forwards += len(output.rows_per_forward)
        self.rows_per_forward.update(output.rows_per_forward)
        self.samples_per_forward.update(output.samples_per_forward)
        self.sizes_per_forward.update(output.sizes_per_forward)
        self.loras_per_forward.update(output.loras_per_forward)
        self.num_sample_steps += len(output.stepped_sample_ids)
        self.forward_seconds += sum(output.forward_seconds)
        self.encode_seconds += output.encode_seconds
        self.num_oom_splits += output.num_oom_splits
        self.num_cache_blocks += output.num_cache_blocks
        self.num_cache_blocks_skipped += output.num_cache_blocks_skipped
        self.num_cache_steps_skipped += output.num_cache_steps_skipped
        self.num_tokens_computed += output.num_tokens_computed
        self.num_tokens_padded += output.num_tokens_padded

    def record_decode(self, result: DecodeResult) -> None:
        """A decoded batch, counted as it is decoded (the engine counts its finished samples, those of jobs
        still unfinished)."""
        self.decode_seconds += result.seconds
        self.num_oom_splits += result.num_oom_splits

    def record_end(self, ending: Ending, num_samples: int) -> None:
        self.num_samples_ended[ending] += num_samples

    def as_dict(self) -> dict:
        num_finished = self.num_samples_ended[Ending.FINISHED]
        return {
            "iterations": self.num_iterations,
            "forwards": self.num_forwards,
            "rows_per_forward": dict(sorted(self.rows_per_forward.items())),
            "jobs_per_forward": dict(sorted(self.samples_per_forward.items())),
            "sizes_per_forward": dict(sorted(self.sizes_per_forward.items())),
            "loras_per_forward": dict(sorted(self.loras_per_forward.items())),
            "job_steps": self.num_sample_steps,
            **{f"jobs_{ending.value}": self.num_samples_ended[ending] for ending in Ending},
            "busy_seconds": round(self.busy_seconds, 6),
            "forward_seconds": round(self.forward_seconds, 6),
            "decode_seconds": round(self.decode_seconds, 6),
            "encode_seconds": round(self.encode_seconds, 6),
            "oom_splits": self.num_oom_splits,
            "tokens_computed": self.num_tokens_computed,
            "tokens_padded": self.num_tokens_padded,
            "steps_per_second": self.num_sample_steps / self.busy_seconds if self.busy_seconds else 0.0,
            "images_per_second": num_finished / self.busy_seconds if self.busy_seconds else 0.0,
        }
