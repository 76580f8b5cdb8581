"""A job as the engine tracks it, the Future its submit returns, and the result that Future resolves to.

A job is one `submit()`. A job for N images becomes N samples (`batching.sample`, seeds
seed..seed+N-1) that batch like any others; the job resolves when all of them have
finished, and fails (aborting the rest) as soon as one of them fails.

A job's progress is counted in its own steps: a 2-image job of 200 steps is at `step k/200`,
not `/400`. Its images' steps are counted once, by the model runner, on their `Sample`s;
`JobProgress.of` derives the job's from them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from batching.sample import Sample
from core.params import GenerationParams

if TYPE_CHECKING:
    from batching.previews import PreviewCallback

ProgressCallback = Callable[[int, int], None]  # JobProgress (step, total), called on the engine loop thread


class Stage(enum.Enum):
    """Where a job is in the engine (batching.job_book): it moves forward only."""

    INBOX = "inbox"  # submitted; the scheduler has not seen it
    SCHEDULED = "scheduled"  # its samples are the scheduler's, the runner's and the decoder's
    ENDED = "ended"  # left the book through its one exit; nothing touches it any more


class Ending(enum.Enum):
    """How a job ended; each is counted in stats() (`jobs_<value>`)."""

    FINISHED = "finished"  # every image decoded: its Future has the result
    FAILED = "failed"  # one of its samples failed, or an engine error failed every scheduled job
    CANCELED = "canceled"  # engine.cancel(): JobCanceledError
    ABORTED = "aborted"  # the engine shut down (or its loop stopped) first: EngineShutdownError


@dataclass(frozen=True, slots=True)
class JobProgress:
    """A job's progress in its own steps, derived from its images' step counts."""

    step: int  # its images' mean steps done, rounded down: each image's step while they run together
    total: int  # the job's step count: the steps each of its images runs (not summed over them)
    current_image: int = 0  # 1-based: the image it is on while its images run one after another; else 0
    has_started: bool = False  # an image of it took a step (`step` is still 0 when one of two took one)

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> JobProgress:
        total = samples[0].num_steps  # every image of a job runs the same steps (batching.sample.make_samples)
        steps = [sample.num_steps_done for sample in samples]
        return cls(sum(steps) // len(steps), total, _current_image(steps, total), any(steps))


def _current_image(steps: list[int], total: int) -> int:
    """The image a multi-image job is on when its images run one after another: the only one partway, or, between
    two images, the next one to start. 0 for a one-image job and while several run together."""
    if len(steps) == 1:
        return 0
    partway = [index for index, done in enumerate(steps) if 0 < done < total]
    if len(partway) == 1:
        return partway[0] + 1
    if not partway and total in steps and 0 in steps:
        return steps.index(0) + 1
    return 0


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
    says which job it is and how far it is (plain attributes the loop thread replaces; read them from any thread)."""

    def __init__(self, job_id: str, progress: JobProgress) -> None:
        super().__init__()
        self.job_id = job_id
        self.progress = progress  # replaced (never changed in place) after each of the job's steps
        self.is_paused = False  # set aside at a step boundary for a job that outranks it (the loop thread sets it)
        self.is_late = False  # it has a complete_by it can no longer make, by the measured step times

    @property
    def num_steps_total(self) -> int:
        """The job's step count: what its progress counts to."""
        return self.progress.total


@dataclass(slots=True)
class Job:
    job_id: str
    params: GenerationParams
    samples: list[Sample]  # one per image, in seed order
    future: JobFuture
    on_progress: ProgressCallback | None
    submitted_at: float
    on_preview: PreviewCallback | None = None  # with its first sample's preview_every
    stage: Stage = Stage.INBOX  # batching.job_book moves it, under its lock
    admitted_at: float | None = None  # when its first sample took its first step
    denoised_at: float | None = None  # when its last sample took its last step
    decode_seconds: float = 0.0
    num_samples_denoised: int = 0  # samples whose last step the loop has seen
    images: dict[str, Any] = field(default_factory=dict)  # sample_id -> PIL image (a video's frames: a list of
    # them), added as they are decoded

    @property
    def sample_ids(self) -> list[str]:
        return [sample.sample_id for sample in self.samples]

    def progress(self) -> JobProgress:
        return JobProgress.of(self.samples)

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
