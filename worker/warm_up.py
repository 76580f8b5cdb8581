"""The worker's warm-up: one small generation through its engine before it says it is ready.

A process's first forward, decode and image encode pay for lazy set-up (kernel selection, memory
pools, the image codecs' first use): measured on `builtin:shapes`, the first job after `ready` took
about fifteen times as long as the next. So the worker runs one job of its model's defaults (two
steps, a preview if the model makes them) through the same engine and encodes its image and preview
as a job's would be, before it answers `celery inspect ping`, writes its first heartbeat and lets
`stepwise up` say ready. The warm-up counts in the engine's statistics as one finished job.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.errors import BatchingError
from core.params import GenerationParams
from worker.output_images import encode_outputs

if TYPE_CHECKING:
    from batching import DiffusionEngine

log = logging.getLogger(__name__)

WARM_UP_STEPS = 2
WARM_UP_JOB_ID = "stepwise-warm-up"
WARM_UP_TIMEOUT_SECONDS = 600


@dataclass(frozen=True)
class WarmUp:
    seconds: float  # the warm-up job's wall time, submit to encoded image
    forwards: int  # denoiser forwards the engine had run when it ended (0: it did not run)
    error: str | None = None  # why it could not run (the worker starts anyway; the first job pays instead)

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "forwards": self.forwards, "error": self.error}


def warm_up(engine: DiffusionEngine, model: str) -> WarmUp:
    """Run one job of `model`'s defaults through `engine`, encode its outputs and preview; never raises."""
    started = time.perf_counter()
    previews: list[Any] = []
    try:
        params = GenerationParams(model=model, prompt="warm-up", seed=0, num_inference_steps=WARM_UP_STEPS)
        future = engine.submit(params, job_id=WARM_UP_JOB_ID, preview_every=1, on_preview=previews.append)
        result = future.result(timeout=WARM_UP_TIMEOUT_SECONDS)
        encode_outputs(result)  # in the model's default format: PNG for images, MP4 for videos
        for preview in previews[:1]:
            preview.data_uri()
    except (BatchingError, TimeoutError) as e:  # a model that needs inputs the warm-up does not give, say
        log.warning("warm-up skipped: %s", e)
        return WarmUp(time.perf_counter() - started, engine.stats()["forwards"], f"{type(e).__name__}: {e}")
    seconds = time.perf_counter() - started
    log.info("warmed up in %.2fs", seconds)
    return WarmUp(seconds, engine.stats()["forwards"])
