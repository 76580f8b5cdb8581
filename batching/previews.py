"""Live previews: every few steps, a cheap approximate image of a sample's latents, made without the VAE.

On the loop thread (`PreviewMaker.make`, from the model runner after a sample's step) the work
is one or two small matmuls: the family's latent-to-RGB factors (`batching.pipelines.latent_rgb`) over the
sample's latent grid (`preview_latents`: 1/8 or 1/16 of the image a side), rounded to bytes and
copied to the CPU without waiting for the device (a CUDA event marks when the copy is done).
Everything else happens on the thread that takes the `Preview` (the worker's job thread):
waiting for the copy, resizing to at most `MAX_PREVIEW_SIDE` pixels on the long side, encoding,
and the data URI. A sample's denoise path reads nothing back: its image is the same with
previews on or off. Imports torch only to make previews (the engine module imports this one).
"""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.errors import InvalidParamsError

if TYPE_CHECKING:
    import torch

    from batching.job import Job
    from batching.pipelines.contract import PipelineAdapter
    from core.params import GenerationParams

logger = logging.getLogger(__name__)

MAX_PREVIEW_SIDE = 256  # pixels on the long side, at most
PREVIEW_FORMAT = "jpeg"  # the cheapest to encode: 0.4 ms at 128x128 on a CPU core, WebP 5 ms, PNG 7 ms
PREVIEW_QUALITY = 85


class PreviewPixels:
    """A preview's bytes as they leave the loop: [h, w, 3] uint8 on the CPU once `event` (CUDA) has passed."""

    def __init__(self, pixels: torch.Tensor, event: Any = None) -> None:
        self._pixels = pixels  # [h, w, 3] uint8, on the CPU (pinned on CUDA, filled asynchronously)
        self._event = event

    def array(self) -> Any:
        """The pixels as a numpy array, waiting for their copy from the device if it is still under way."""
        if self._event is not None:
            self._event.synchronize()
        return self._pixels.numpy()


@dataclass(frozen=True)
class Preview:
    """What a job's `on_preview` gets: an approximate image of its first sample after `step` of `total` steps."""

    step: int  # the job's progress when it was made (as on_progress counts it)
    total: int
    width: int  # the image's size: the preview keeps its aspect ratio
    height: int
    pixels: PreviewPixels

    def image(self) -> Any:
        """A PIL image of at most MAX_PREVIEW_SIDE pixels on the long side (and no larger than the image)."""
        from PIL import Image

        grid = Image.fromarray(self.pixels.array())
        scale = min(1.0, MAX_PREVIEW_SIDE / max(self.width, self.height))
        size = (max(1, round(self.width * scale)), max(1, round(self.height * scale)))
        return grid.resize(size, Image.Resampling.BILINEAR)

    def data_uri(self) -> str:
        buffer = io.BytesIO()
        self.image().save(buffer, format=PREVIEW_FORMAT, quality=PREVIEW_QUALITY)
        return f"data:image/{PREVIEW_FORMAT};base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"


PreviewCallback = Callable[[Preview], None]  # called on the engine loop thread: keep it cheap (store it)


def previews_wanted(preview_every: Any, on_preview: PreviewCallback | None, maker: PreviewMaker | None) -> int:
    """A submit's `preview_every` checked: what its job's first sample gets (0 without a callback or a maker)."""
    if isinstance(preview_every, bool) or not isinstance(preview_every, int) or preview_every < 0:
        raise InvalidParamsError("preview_every", preview_every, "must be a whole number of steps, 0 for none")
    return preview_every if on_preview is not None and maker is not None else 0


def report_preview(job: Job, pixels: PreviewPixels) -> None:
    """Hand a preview of `job`'s first sample to its callback, at the job's progress (loop thread)."""
    if job.on_preview is None:
        return
    try:
        progress = job.future.progress
        job.on_preview(Preview(progress.step, progress.total, job.params.width, job.params.height, pixels))
    except Exception:
        logger.exception("on_preview callback of job %s raised; ignored", job.job_id)


class PreviewMaker:
    """The loop thread's part: latents to a small RGB byte grid with the model's factors, kept on its device."""

    def __init__(self, model: PipelineAdapter) -> None:
        assert model.latent_rgb is not None, "a model without factors makes no previews"
        self.model = model
        self.to_rgb = model.latent_rgb.on(model.device)
        self.is_cuda = model.device.type == "cuda"

    def make(self, latents: torch.Tensor, params: GenerationParams) -> PreviewPixels:
        """`latents`: [1, *latent_shape], the sample's current latents (or its sampler's estimate of the final
        ones) in the family's layout. Called in the runner's inference mode."""
        import torch

        grid = self.model.preview_latents(latents, params).float()  # [c, h, w]
        rgb = self.to_rgb(grid)  # [h, w, 3] in about [-1, 1]
        pixels = ((rgb + 1) * 127.5).clamp(0, 255).to(torch.uint8)  # [h, w, 3]
        if not self.is_cuda:
            return PreviewPixels(pixels)
        host = torch.empty(pixels.shape, dtype=torch.uint8, pin_memory=True)
        host.copy_(pixels, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return PreviewPixels(host, event)
