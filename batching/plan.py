"""The written contract between the scheduler and the model runner.

`SchedulerPlan` goes scheduler -> runner once per engine iteration; a new job's full
params are sent once (in `new_jobs`), afterwards only ids. `RunnerOutput` goes runner
-> engine/scheduler and carries plain Python values: ids, counts, messages, and the
decoded PIL images of finished jobs (the scheduler never looks at those). No tensors
cross back. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batching.params import CompatibilityKey, GenerationParams


@dataclass(frozen=True)
class NewJob:
    job_id: str
    params: GenerationParams  # single image: num_images == 1, seed fixed
    key: CompatibilityKey


@dataclass
class SchedulerPlan:
    new_jobs: list[NewJob] = field(default_factory=list)  # admitted this iteration; params sent once
    groups: dict[CompatibilityKey, list[str]] = field(default_factory=dict)  # key -> running job_ids (new ones included); one forward each
    freed_job_ids: list[str] = field(default_factory=list)  # finished, failed or aborted since the last plan: runner drops their state
    num_rows_by_key: dict[CompatibilityKey, int] = field(default_factory=dict)  # key -> rows its forward carries (2 per guided job, 1 otherwise)

    @property
    def is_empty(self) -> bool:
        return not self.groups and not self.freed_job_ids


@dataclass
class RunnerOutput:
    stepped_job_ids: list[str] = field(default_factory=list)  # jobs that advanced exactly one denoise step
    finished_job_ids: list[str] = field(default_factory=list)  # jobs whose last step ran and whose image was decoded
    images: dict[str, Any] = field(default_factory=dict)  # job_id -> PIL.Image, for finished jobs
    failed: dict[str, str] = field(default_factory=dict)  # job_id -> readable error message
    rows_per_forward: list[int] = field(default_factory=list)  # one entry per forward run (padding excluded)
    forward_seconds: list[float] = field(default_factory=list)  # wall time of each forward, same order
    encode_seconds: float = 0.0  # text-encoder time for this iteration's new jobs
    decode_seconds: float = 0.0  # VAE decode time for this iteration's finished jobs
