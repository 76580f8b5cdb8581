"""A job as the engine tracks it, and the result its Future resolves to.

A job is one `submit()`. A job for N images becomes N samples (seeds seed..seed+N-1)
that batch like any others; the job resolves when all of them have finished, and fails
(aborting the rest) as soon as one of them fails.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from batching.params import GenerationParams

ProgressCallback = Callable[[int, int], None]  # (steps done, total steps), called on the engine loop thread


@dataclass(frozen=True)
class GenerationResult:
    job_id: str  # the job's id, as given to or returned by submit()
    images: list[Any]  # PIL images, one per seed, in seed order
    seeds: list[int]  # seed of each image: params.seed + index
    params: GenerationParams  # the job as submitted (num_images may be > 1)
    timings: dict[str, float]  # seconds: "queue_wait" (submit to first step), "denoise" (first to last step), "decode"

    @property
    def image(self) -> Any:
        return self.images[0]


@dataclass(slots=True)
class Job:
    job_id: str
    params: GenerationParams
    future: Future
    sample_ids: list[str]  # one sample per image, in seed order
    on_progress: ProgressCallback | None
    submitted_at: float
    priority: str = "normal"  # one of batching.params.PRIORITIES; the scheduler admits higher first
    admitted_at: float | None = None  # when its first sample took its first step
    denoised_at: float | None = None  # when its last sample took its last step
    decode_seconds: float = 0.0
    num_steps_done: int = 0  # over all its samples
    images: dict[str, Any] = field(default_factory=dict)  # sample_id -> PIL image
    steps_per_sample: int | None = None  # steps each sample runs (fewer with an init image); None: all

    @property
    def num_steps_total(self) -> int:
        if self.steps_per_sample is None:
            return self.params.total_steps()
        return len(self.sample_ids) * self.steps_per_sample

    @property
    def is_complete(self) -> bool:
        return len(self.images) == len(self.sample_ids)

    def result(self) -> GenerationResult:
        assert self.is_complete and self.admitted_at is not None and self.denoised_at is not None
        assert self.params.seed is not None  # GenerationParams draws one when none is given
        return GenerationResult(
            job_id=self.job_id,
            images=[self.images[sample_id] for sample_id in self.sample_ids],
            seeds=[self.params.seed + index for index in range(len(self.sample_ids))],
            params=self.params,
            timings={
                "queue_wait": self.admitted_at - self.submitted_at,
                "denoise": self.denoised_at - self.admitted_at,
                "decode": self.decode_seconds,
            },
        )


def sample_ids_for(job_id: str, num_images: int) -> list[str]:
    """Sample ids of a job: its own id for one image, `job_id#i` for several."""
    if num_images == 1:
        return [job_id]
    return [f"{job_id}#{index}" for index in range(num_images)]
