"""VAE decode beside the denoise loop.

A finished sample's last latents are handed to the `Decoder`; the loop goes on to the
next iteration's forwards at once. Each decoded batch goes to the engine (`on_images`) on
the thread that decoded it, so a job whose last image is in resolves without waiting for
the loop's forward; the loop picks the batch up at a later iteration's end (`collect()`,
which never waits) for its failures and its bookkeeping. With `is_async` the decode runs on a worker thread,
on CUDA in its own stream: the hand-over records an event on the loop's stream after
the last sampler step, the decode stream waits for that event (not the host), and the
latents are marked as used by the decode stream so the allocator does not reuse their
memory early. The worker synchronises only its own stream, where the images must reach
the host. Without `is_async` the decode runs inline in `submit()` (the old behaviour,
kept because two threads of one process that both run torch ops on the CPU slow each
other: see docs/benchmarks.md for what it measured).

A decode batch that runs out of memory is split like a forward (`batching.oom`); a
sample fails only if it cannot be decoded alone. A sample whose decoded image holds NaN or
infinite values (the pipeline adapter's decode gives None for it: non-finite latents from an
overflowing LoRA adapter, say, or a VAE overflowing in half precision) fails, naming its adapter,
instead of passing as a black picture. Cancellation: `discard()` drops the
images of samples whose job ended meanwhile, so a
canceled job is never counted as finished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from batching.beside_loop import BesideTheLoop
from batching.oom import alone_message, run_splitting
from batching.pipelines.contract import PipelineAdapter
from batching.sample_tensors import SampleTensors
from core.image_inputs import keep_unmasked_pixels
from core.params import GenerationParams

logger = logging.getLogger(__name__)


@dataclass
class DecodeResult:
    images: dict[str, Any] = field(default_factory=dict)  # sample_id -> PIL image (a video's: its frames, a list)
    failed: dict[str, str] = field(default_factory=dict)  # sample_id -> message
    seconds: float = 0.0  # wall time of the batch's decode (on the worker when async)
    num_oom_splits: int = 0


@dataclass
class _Batch:
    samples: list[SampleTensors]  # their last latents
    ready: Any = None  # torch.cuda.Event recorded on the loop's stream after the latents were final


class Decoder(BesideTheLoop[DecodeResult]):
    def __init__(
        self,
        model: PipelineAdapter,
        *,
        is_async: bool,
        on_images: Callable[[DecodeResult], None] = lambda result: None,
        on_result: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_images(result)`: each decoded batch, on the thread that decoded it, before `collect()` can return
        it (the engine resolves finished jobs there); `on_result()`: after (the engine wakes its loop)."""
        self._on_images = on_images
        self.num_pending = 0  # batches submitted and not yet collected; loop thread only
        self.pending_sample_ids: set[str] = set()  # their samples; loop thread only
        super().__init__(model, is_async=is_async, thread_name="stepwise-decode", on_result=on_result)

    def submit(self, batches: Sequence[list[SampleTensors]]) -> None:
        """Decode each batch (samples of one size, after their last step); inline, or queued to the worker."""
        for samples in batches:
            self.num_pending += 1
            self.pending_sample_ids.update(sample.sample_id for sample in samples)
            batch = _Batch(samples)
            if self._stream is not None:
                batch.ready = torch.cuda.Event()
                batch.ready.record(torch.cuda.current_stream(self.model.device))  # after the last sampler step
                for sample in samples:
                    sample.latents.record_stream(self._stream)
            if self.is_async:
                self._queue.put(batch)
            else:
                self._finish(self._decode(batch))

    def collect(self) -> list[DecodeResult]:
        """The batches decoded since the last call, without the discarded samples; never waits."""
        results = self._take_results()
        self.num_pending -= len(results)
        for result in results:
            self.pending_sample_ids.difference_update(result.images.keys() | result.failed.keys())
            for sample_id in self._discarded.intersection(result.images.keys() | result.failed.keys()):
                result.images.pop(sample_id, None)
                result.failed.pop(sample_id, None)
                self._discarded.discard(sample_id)
        return results

    def discard(self, sample_ids: Collection[str]) -> None:
        """Forget these samples' images when they arrive (their job ended while they were decoding)."""
        self._discarded.update(self.pending_sample_ids.intersection(sample_ids))

    def _work(self) -> None:
        while (batch := self._queue.get()) is not None:
            with torch.inference_mode():
                if self._stream is None:
                    result = self._decode(batch)
                else:
                    with torch.cuda.stream(self._stream):
                        self._stream.wait_event(batch.ready)
                        result = self._decode(batch)
            self._finish(result)

    def _decode(self, batch: _Batch) -> DecodeResult:
        start = time.perf_counter()
        result = DecodeResult()
        samples = batch.samples
        try:
            outcome = run_splitting([samples], self._decode_chunk, rows_of=len, device=self.model.device)
        except Exception as e:
            logger.exception("decode failed")
            message = f"decoding the image failed: {type(e).__name__}: {e}"
            result.failed.update((sample.sample_id, message) for sample in samples)
        else:
            result.num_oom_splits = outcome.num_splits
            for chunk, images in outcome.results:
                for sample, image in zip(chunk, images):
                    if image is None:
                        result.failed[sample.sample_id] = _not_finite_message(sample.params)
                    elif isinstance(image, list):  # a video's frames
                        result.images[sample.sample_id] = image
                    else:  # an inpainting job's kept region, composited here beside the loop, not on it
                        result.images[sample.sample_id] = keep_unmasked_pixels(sample.sample.images, image)
            for sample, error in outcome.failed:
                result.failed[sample.sample_id] = alone_message("decoding this image", 1, error)
        result.seconds = time.perf_counter() - start
        self._on_images(result)
        return result

    def _decode_chunk(self, samples: list[SampleTensors]) -> list[Any]:
        return list(
            self.model.decode(torch.cat([sample.latents for sample in samples]), [sample.params for sample in samples])
        )


def _not_finite_message(params: GenerationParams) -> str:
    """A sample whose image holds NaN or infinity (its latents, or a VAE overflowing in half precision)
    would be cast to a black picture: it fails instead, naming its adapter when it has one."""
    message = "the image came out not finite (NaN or infinite values: the model overflowed)"
    if params.lora is not None:
        return f"{message}; its LoRA adapter {params.lora!r} (scale {params.lora_scale}) likely overflows"
    return f"{message}: try another seed, a lower guidance_scale or a higher-precision dtype"
