"""A job as the engine tracks it, the Future its submit returns, and the result that Future resolves to.

A job is one `submit()`. A job for N images becomes N samples (`batching.sample`, seeds
seed..seed+N-1) that batch like any others; the job resolves when all of them have
finished, and fails (aborting the rest) as soon as one of them fails.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from batching.sample import Sample
from core.params import GenerationParams

if TYPE_CHECKING:
    from batching.previews import PreviewCallback

ProgressCallback = Callable[[int, int], None]  # (steps done, total steps), called on the engine loop thread


@dataclass(frozen=True)
class GenerationResult:
    job_id: str  # the job's id, as given to or returned by submit()
    images: list[Any]  # PIL images, one per seed, in seed order (a video's: its first frame)
    seeds: list[int]  # seed of each image: params.seed + index
    params: GenerationParams  # the job as submitted (num_images may be > 1)
    timings: dict[str, float]  # seconds: "queue_wait" (submit to first step), "denoise" (first to last step), "decode"
    # Each output's frames (PIL images), in seed order, as diffusers' video pipelines return them; an image (any
    # job of num_frames 1) is one frame, the same object as in `images`.
    frames: list[list[Any]] = field(default_factory=list)

    @property
    def image(self) -> Any:
        return self.images[0]


class JobFuture(Future):
    """What `DiffusionEngine.submit` returns: a `concurrent.futures.Future` of a `GenerationResult` that also
    says which job it is and how many denoise steps the job runs (what its progress counts to)."""

    def __init__(self, job_id: str, num_steps_total: int) -> None:
        super().__init__()
        self.job_id = job_id
        self.num_steps_total = num_steps_total
        self.is_paused = False  # set aside at a step boundary for a job that outranks it (the loop thread sets it)
        self.is_late = False  # it has a complete_by it can no longer make, by the measured step times


@dataclass(slots=True)
class Job:
    job_id: str
    params: GenerationParams
    samples: list[Sample]  # one per image, in seed order
    future: JobFuture
    on_progress: ProgressCallback | None
    submitted_at: float
    on_preview: PreviewCallback | None = None  # with its first sample's preview_every
    admitted_at: float | None = None  # when its first sample took its first step
    denoised_at: float | None = None  # when its last sample took its last step
    decode_seconds: float = 0.0
    num_steps_done: int = 0  # over all its samples
    num_samples_denoised: int = 0  # samples whose last step the loop has seen
    images: dict[str, Any] = field(default_factory=dict)  # sample_id -> PIL image (a video's frames: a list of
    # them), added as they are decoded

    @property
    def sample_ids(self) -> list[str]:
        return [sample.sample_id for sample in self.samples]

    @property
    def num_steps_total(self) -> int:
        return sum(sample.num_steps for sample in self.samples)

    @property
    def is_complete(self) -> bool:
        """Every sample's last step was seen and its image decoded: the job can resolve."""
        return len(self.images) == self.num_samples_denoised == len(self.samples)

    def result(self) -> GenerationResult:
        assert self.is_complete and self.admitted_at is not None and self.denoised_at is not None
        assert self.params.seed is not None  # GenerationParams draws one when none is given
        outputs = [self.images[sample.sample_id] for sample in self.samples]  # a video's: its list of frames
        frames = [output if isinstance(output, list) else [output] for output in outputs]
        return GenerationResult(
            job_id=self.job_id,
            images=[output[0] for output in frames],
            frames=frames,
            seeds=[self.params.seed + index for index in range(len(self.samples))],
            params=self.params,
            timings={
                "queue_wait": self.admitted_at - self.submitted_at,
                "denoise": self.denoised_at - self.admitted_at,
                "decode": self.decode_seconds,
            },
        )
