"""The written contract between the scheduler and the model runner.

`SchedulerPlan` goes scheduler -> runner once per engine iteration; a new sample
(`batching.sample.Sample`: its params, key and step count) is handed over once, in
`new_samples`, afterwards only its id. `RunnerOutput` goes runner
-> engine/scheduler and carries plain Python values: ids, counts and messages. No
tensors cross back; decoded images go from the decoder to the engine directly, as they
are decoded. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batching.sample import Sample
from core.params import CompatibilityKey


@dataclass
class SchedulerPlan:
    new_samples: list[Sample] = field(default_factory=list)  # admitted this iteration; handed over once
    # key -> running sample_ids (new ones included); one forward each
    groups: dict[CompatibilityKey, list[str]] = field(default_factory=dict)
    # aborted while running since the last plan: the runner drops their state
    aborted_sample_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.groups and not self.aborted_sample_ids


@dataclass
class RunnerOutput:
    """What one `execute(plan)` did. The runner has already dropped finished and failed samples."""

    stepped_sample_ids: list[str] = field(default_factory=list)  # samples that advanced exactly one denoise step
    denoised_sample_ids: list[str] = field(default_factory=list)  # samples whose last step ran: handed to the decoder
    finished_sample_ids: list[str] = field(default_factory=list)  # samples whose image was decoded (this or an earlier
    # plan's last step: decoding runs beside the loop, which hands the images to the engine as they come)
    failed: dict[str, str] = field(default_factory=dict)  # sample_id -> readable error message
    rows_per_forward: list[int] = field(default_factory=list)  # one entry per forward run (padding excluded)
    sizes_per_forward: list[int] = field(default_factory=list)  # distinct image sizes in each forward run
    samples_per_forward: list[int] = field(default_factory=list)  # samples each forward carried, same order
    loras_per_forward: list[int] = field(default_factory=list)  # distinct LoRA adapters among each forward's rows
    forward_seconds: list[float] = field(default_factory=list)  # time of each forward whose work completed since the
    # last output, oldest first (wall time on the CPU; CUDA event time, read without waiting: maybe a later output)
    encode_seconds: float = 0.0  # time to start the samples collected in this output (prompt and init-image
    # encoding, first latents; on the encoder worker when encoding overlaps the loop)
    num_samples_starting: int = 0  # planned samples still being started: they skipped this iteration's forwards
    num_oom_splits: int = 0  # out-of-memory errors answered by splitting a forward
    num_tokens_computed: int = 0  # denoiser sequence positions this output's forwards computed, all rows, text
    # tokens included (ForwardBatch.num_positions)
    num_tokens_padded: int = 0  # of those, positions of no sample's own (ForwardBatch.num_padded_positions)
    num_cache_blocks: int = 0  # step cache (core.step_cache): block evaluations a full forward of every row
    # would have run, summed over this output's forwards (families with a step cache only)
    num_cache_blocks_skipped: int = 0  # of those, the ones skipped by samples that reused their cache
    num_cache_steps_skipped: int = 0  # sample steps that reused their cache
    admission_caps: dict[CompatibilityKey, int] = field(default_factory=dict)  # key -> most samples that fit in one
    # forward after an out-of-memory split, for keys capped in this iteration (the scheduler admits no more meanwhile)
