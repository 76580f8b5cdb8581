"""Starting admitted samples beside the denoise loop: prompt encoding, init images, first latents.

A sample the scheduler admits is handed to the `Encoder`, which encodes the prompts of
every sample handed over since it last looked (one text-encoder call per batch, per
text-encoder LoRA adapter), VAE-encodes their init images, and draws each one's sampler
and first latents. The runner puts a sample into its group's forward only once it has
been started (`collect()`, which never waits), so with `is_async` the running samples
keep stepping while a new prompt encodes: the work runs on a worker thread, on CUDA in
its own stream (it waits for an event recorded on the loop's stream at hand-over, so
adapter weights loaded just before are complete; the loop's stream waits for the
encoder's event before using a started sample, and the sample's tensors are marked as
used by the loop's stream). Without `is_async` it runs inline in `submit()` and the
sample joins the same iteration's forward (the old behaviour, kept because two threads
of one process that both run torch ops on the CPU slow each other: docs/benchmarks.md).

Failures touch only their samples: a text-encoder call that fails is retried one text at
a time, and only the samples whose texts fail alone fail; a sample whose prompts or init image
cannot even be prepared fails alone; any other error while starting a batch fails the batch's
samples not started yet, and the encoder goes on with the next. Cancellation: `discard()`
drops the samples whose job ended while they were being started. LoRA adapters are
loaded by the loop; it holds `model_lock` while it changes the model, which the worker
holds while it runs the text encoder, so an adapter is never injected mid-call.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from batching.beside_loop import BesideTheLoop
from batching.image_start import ImageStart, encode_init_images, start_from_image
from batching.pipelines.contract import Conditioning, PipelineAdapter
from batching.sample import Sample
from batching.sample_tensors import SampleTensors
from core.errors import describe
from core.params import GenerationParams

logger = logging.getLogger(__name__)

TextEncoderAdapter = tuple[str, float] | None  # (internal PEFT name, scale) of a LoRA with text-encoder weights
EncodingWith = Callable[[TextEncoderAdapter], contextlib.AbstractContextManager]
AdapterOf = Callable[[GenerationParams], TextEncoderAdapter]  # the text-encoder adapter a sample's prompts use


@dataclass
class StartResult:
    samples: list[SampleTensors] = field(default_factory=list)  # ready to join their group's forward
    failed: dict[str, str] = field(default_factory=dict)  # sample_id -> message
    seconds: float = 0.0  # wall time of the batch's start (on the worker when async)
    ready: Any = None  # torch.cuda.Event recorded on the encoder's stream after the batch


@dataclass
class _Batch:
    samples: list[Sample]
    adapters: dict[str, TextEncoderAdapter]  # sample_id -> the text-encoder adapter its prompts go through
    ready: Any = None  # torch.cuda.Event recorded on the loop's stream at hand-over


class Encoder(BesideTheLoop[StartResult]):
    def __init__(
        self,
        model: PipelineAdapter,
        *,
        is_async: bool,
        chunk_size: int | None = None,
        adapter_of: AdapterOf | None = None,
        encoding_with: EncodingWith | None = None,
        on_result: Callable[[], None] = lambda: None,
    ) -> None:
        """`chunk_size`: deterministic mode, every text-encoder call gets exactly this many texts (padded) and
        init images are encoded one at a time. `adapter_of(params)`: the text-encoder adapter of a sample,
        resolved on the loop thread at hand-over (EngineLoras.text_encoder_adapter); `encoding_with(adapter)`:
        the block in which a text-encoder call uses it (EngineLoras.encoding_with)."""
        self.chunk_size = chunk_size
        self._adapter_of = adapter_of
        self._encoding_with = encoding_with
        self.model_lock = threading.Lock()  # held while the text encoder runs or the loop changes the model
        super().__init__(model, is_async=is_async, thread_name="stepwise-encode", on_result=on_result)

    def submit(self, samples: Sequence[Sample]) -> None:
        """Start these samples: inline, or queued to the worker (which batches what arrived meanwhile)."""
        if not samples:
            return
        adapter_of = self._adapter_of
        batch = _Batch(
            list(samples), {sample.sample_id: adapter_of(sample.params) if adapter_of else None for sample in samples}
        )
        if self._stream is not None:
            batch.ready = torch.cuda.Event()
            batch.ready.record(torch.cuda.current_stream(self.model.device))
        self._hand_over({sample.sample_id: sample for sample in samples}, [batch])

    def start_now(self, samples: Sequence[Sample]) -> StartResult:
        """Start these samples on the calling thread, outside the hand-over (the engine's start-up measurements:
        the loop does not run yet). Failures are in the result, as for any batch."""
        adapter_of = self._adapter_of
        batch = _Batch(
            list(samples), {sample.sample_id: adapter_of(sample.params) if adapter_of else None for sample in samples}
        )
        with torch.inference_mode():
            return self._run([batch])

    def collect(self) -> list[StartResult]:
        """The batches started since the last call, without the discarded samples; never waits."""
        results = super().collect()
        for result in results:
            if result.ready is not None:
                stream = torch.cuda.current_stream(self.model.device)
                stream.wait_event(result.ready)
                for sample in result.samples:
                    for tensor in _tensors_of(sample):
                        tensor.record_stream(stream)
        return results

    def _work(self) -> None:
        while (batches := self._queue.get()) is not None:
            is_closing = False
            while not self._queue.empty():  # whatever arrived meanwhile goes through the same calls
                more = self._queue.get_nowait()
                if more is None:
                    is_closing = True
                    break
                batches += more
            with torch.inference_mode():
                if self._stream is None:
                    result = self._run(batches)
                else:
                    with torch.cuda.stream(self._stream):
                        for each in batches:
                            self._stream.wait_event(each.ready)
                        result = self._run(batches)
                        result.ready = torch.cuda.Event()
                        result.ready.record(self._stream)
            self._finish(result)
            if is_closing:
                break

    def _run(self, batches: list[_Batch]) -> StartResult:
        """Start the batches' samples; an error outside one sample fails those not started yet, with the error."""
        start = time.perf_counter()
        result = StartResult()
        try:
            self._start(batches, result)
        except Exception as e:
            logger.exception("starting %d samples failed", sum(len(batch.samples) for batch in batches))
            started = {sample.sample_id for sample in result.samples}
            for batch in batches:
                for sample in batch.samples:
                    if sample.sample_id not in started:
                        result.failed.setdefault(sample.sample_id, f"could not start the job: {describe(e)}")
        result.seconds = time.perf_counter() - start
        return result

    def _start(self, batches: list[_Batch], result: StartResult) -> None:
        samples = [sample for batch in batches for sample in batch.samples]
        adapters = {sample_id: adapter for batch in batches for sample_id, adapter in batch.adapters.items()}
        texts_of_sample: dict[str, list[str]] = {}
        for sample in samples:
            try:
                texts_of_sample[sample.sample_id] = list(self.model.texts_to_encode(sample.params))
            except Exception as e:
                logger.exception("the prompts of sample %s cannot be encoded", sample.sample_id)
                result.failed[sample.sample_id] = f"prompt encoding failed: {describe(e)}"
        texts_of_adapter: dict[TextEncoderAdapter, set[str]] = {}
        for sample_id, sample_texts in texts_of_sample.items():
            texts_of_adapter.setdefault(adapters[sample_id], set()).update(sample_texts)
        encoded: dict[TextEncoderAdapter, dict[str, Conditioning | Exception]] = {}
        with self.model_lock:
            for adapter, texts in texts_of_adapter.items():
                encoded[adapter] = self._encode_texts(adapter, sorted(texts))
        ready: list[tuple[Sample, dict[str, Conditioning]]] = []
        for sample in samples:
            conditioning: dict[str, Conditioning] = {}
            for text in texts_of_sample.get(sample.sample_id, ()):
                outcome = encoded[adapters[sample.sample_id]][text]
                if isinstance(outcome, Exception):
                    result.failed[sample.sample_id] = f"prompt encoding failed: {describe(outcome)}"
                    break
                conditioning[text] = outcome
            else:
                if sample.sample_id not in result.failed:
                    ready.append((sample, conditioning))
        init_images = encode_init_images(
            self.model, [sample for sample, _ in ready], one_at_a_time=self.chunk_size is not None
        )
        for sample, conditioning in ready:
            try:
                result.samples.append(self._sample_tensors(sample, conditioning, init_images.get(sample.sample_id)))
            except Exception as e:
                logger.exception("could not start sample %s", sample.sample_id)
                result.failed[sample.sample_id] = f"could not start the job: {describe(e)}"

    def _failed(self, sample_ids: list[str], message: str) -> StartResult:
        return StartResult(failed=dict.fromkeys(sample_ids, f"could not start the job: {message}"))

    def _sample_ids(self, result: StartResult) -> set[str]:
        return {sample.sample_id for sample in result.samples} | result.failed.keys()

    def _drop(self, result: StartResult, sample_ids: set[str]) -> None:
        result.samples = [sample for sample in result.samples if sample.sample_id not in sample_ids]
        result.failed = {key: value for key, value in result.failed.items() if key not in sample_ids}

    def _encode_texts(self, adapter: TextEncoderAdapter, texts: list[str]) -> dict[str, Conditioning | Exception]:
        """Each text's conditioning from one call; after a failure, one call per text (its own error)."""
        with self._encoding_with(adapter) if self._encoding_with else contextlib.nullcontext():
            try:
                return dict(zip(texts, self._encode(texts)))
            except Exception as e:
                logger.exception("text encoder failed on %d texts", len(texts))
                if len(texts) == 1:
                    return {texts[0]: e}
            encoded: dict[str, Conditioning | Exception] = {}
            for text in texts:
                try:
                    encoded[text] = self._encode([text])[0]
                except Exception as e:
                    encoded[text] = e
            return encoded

    def _encode(self, texts: list[str]) -> list[Conditioning]:
        if self.chunk_size is None:
            return self.model.encode_prompts(texts)
        encoded: list[Conditioning] = []
        for start in range(0, len(texts), self.chunk_size):
            chunk = texts[start : start + self.chunk_size]
            encoded += self.model.encode_prompts(chunk + [""] * (self.chunk_size - len(chunk)))[: len(chunk)]
        return encoded

    def _sample_tensors(self, sample: Sample, encoded: dict[str, Conditioning], init_image: Any) -> SampleTensors:
        params = sample.params
        sampler = self.model.new_sampler(params)
        assert len(sampler.timesteps) == sample.first_step + sample.num_steps, "one timestep per step it runs"
        assert params.seed is not None  # GenerationParams draws one when none is given
        generator = torch.Generator("cpu").manual_seed(params.seed)
        if init_image is None:  # text-to-image: noise
            image_start = ImageStart(self.model.initial_latents(params, sampler, generator))
        elif isinstance(init_image, Exception):
            raise init_image
        else:  # the noised init image, and an inpaint guide or mask channels (every sample of such a model)
            image_start = start_from_image(self.model, sample, sampler, generator, init_image)
        row_conditioning = self.model.row_conditioning(params, encoded)
        if self.model.edits_init_image and sample.images is not None:  # its init image conditions every row
            image_rows = self.model.image_conditioning(params, sample.images)
            per_row = image_rows if isinstance(image_rows, list) else [image_rows] * len(row_conditioning)
            row_conditioning = [{**row, **extra} for row, extra in zip(row_conditioning, per_row, strict=True)]
        if image_start.row_inputs:  # a model with mask channels: each row carries the sample's mask and image
            row_conditioning = [{**row, **image_start.row_inputs} for row in row_conditioning]
        sigmas = getattr(sampler, "sigmas", None)
        return SampleTensors(
            sample=sample,
            sampler=sampler,
            generator=generator,
            latents=image_start.latents,
            row_conditioning=row_conditioning,
            guide=image_start.guide,
            host_timesteps=sampler.timesteps.cpu(),  # here, beside the loop: the loop never reads them back
            host_sigmas=sigmas.cpu() if isinstance(sigmas, torch.Tensor) else None,
        )


def _tensors_of(sample: SampleTensors) -> Iterator[torch.Tensor]:
    """The device tensors a started sample carries (its latents, conditioning, guide and sampler state)."""
    candidates: list[Any] = [sample.latents]
    candidates += [tensor for row in sample.row_conditioning for tensor in row.values()]
    if sample.guide is not None:
        candidates += [sample.guide.image_latents, sample.guide.noise, sample.guide.mask]
    candidates += list(vars(sample.sampler).values())
    for candidate in candidates:
        if isinstance(candidate, torch.Tensor) and candidate.device.type == "cuda":
            yield candidate
