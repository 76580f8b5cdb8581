"""The model runner: executes a scheduler plan on the model and reports plain results.

It owns every running sample's tensors (sampler, generator, latents, row conditioning)
and one `InputBatch` per group, and knows no model family: the adapter
(`batching.pipelines.contract`) does everything family-specific. Per plan: drop aborted
samples, hand the new samples to the encoder (`batching.encoder`: prompts encoded beside
the loop, or inline; a sample joins its group's forwards once started), run one denoiser
forward per group, step each sample's own sampler, hand the samples that finished to the
decoder (`batching.decoder`: beside the loop, or inline) and collect the images decoded meanwhile.
A sample that asked for live previews gets one every `preview_every` of its steps (`batching.previews`:
one small matmul on its latents, copied off the device without waiting); the engine takes them
with `take_previews()` after the plan.
Between two group forwards it asks the engine for samples canceled meanwhile, so a
cancel or an abort takes effect within one forward. A failure is contained: an
exception in a group's forward fails that group's samples, one in a sample's sampler
step or decode fails that sample, and the runner keeps serving the rest. An
out-of-memory error is not a failure: the group is split and retried (`batching.oom`).
The device is never synchronised here: forwards are timed with device events
(`batching.device_timing`), and only the decoder waits, for the images.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, cast

import torch

from batching.batched_steps import Stepped, batch_kind, guided_predictions, step_together
from batching.decoder import Decoder, DecodeResult
from batching.denoiser_compile import compile_denoiser, mark_forward_start
from batching.device_timing import DeviceTimer
from batching.encoder import Encoder
from batching.forward_curve import row_buckets
from batching.image_start import blend_unmasked
from batching.input_batch import InputBatch
from batching.oom import RowCaps, alone_message, run_splitting
from batching.pipelines.contract import CachedSample, ForwardBatch, PipelineAdapter, StepCacheState, StepCaching
from batching.plan import RunnerOutput, SchedulerPlan
from batching.previews import PreviewMaker, PreviewPixels
from batching.sample import Sample
from batching.sample_tensors import SampleTensors
from batching.step_phases import NoPhases, Phases
from core.errors import LoraError
from core.families import FAMILIES
from core.params import CompatibilityKey
from core.step_cache import CacheSetting, num_final_steps, sample_threshold

if TYPE_CHECKING:
    from batching.lora.engine_loras import EngineLoras

logger = logging.getLogger(__name__)

AbortedSince = Callable[[], Collection[str]]  # sample ids aborted since the last call


class ModelRunner:
    def __init__(
        self,
        model: PipelineAdapter,
        *,
        max_num_seqs: int,
        is_deterministic: bool = False,
        loras: EngineLoras | None = None,
        decode_overlap: bool = False,
        on_images: Callable[[DecodeResult], None] = lambda result: None,
        on_decoded: Callable[[], None] = lambda: None,
        encode_overlap: bool = False,
        on_encoded: Callable[[], None] = lambda: None,
        default_cache: CacheSetting = "off",
        phases: Phases | None = None,
        denoiser_compile: str = "off",
    ) -> None:
        self.model = model
        self.phases: Phases = phases or NoPhases()  # where each iteration's time goes (batching.step_phases)
        self.cache_kind = FAMILIES[model.family].step_cache  # None: the family has no step cache
        self.step_caching = cast(StepCaching, model) if self.cache_kind else None
        self.default_cache = default_cache  # of samples whose params name none
        self.loras = loras  # None: no LoRA store; the engine refuses jobs naming an adapter
        self.max_num_seqs = max_num_seqs
        self.is_deterministic = is_deterministic
        # Deterministic mode fixes every batch size: forwards carry the most rows a full group can,
        # the text encoder sees fixed-size chunks, and the VAE decodes one image at a time.
        self.num_padded_rows = model.max_rows_per_sample * max_num_seqs if is_deterministic else None
        # A compiled denoiser is specialised to its shapes: forwards are padded to row-count buckets.
        self.compile_mode = denoiser_compile
        self.compiled = compile_denoiser(model.pipeline, denoiser_compile, model.device)
        self.row_buckets: tuple[int, ...] | None = None  # padded row counts of a forward (batching.input_batch)
        if self.num_padded_rows is not None:
            self.row_buckets = (self.num_padded_rows,)
        elif self.compiled:
            self.row_buckets = row_buckets(model.max_rows_per_sample * max_num_seqs, model.max_rows_per_sample)
        self.samples: dict[str, SampleTensors] = {}
        self.input_batches: dict[tuple[CompatibilityKey, str], InputBatch] = {}  # (key, chunk) -> its buffers
        self.row_caps: RowCaps[SampleTensors] = RowCaps()
        self.decoder = Decoder(model, is_async=decode_overlap, on_images=on_images, on_result=on_decoded)
        self.encoder = Encoder(
            model,
            is_async=encode_overlap,
            chunk_size=self.num_padded_rows,
            adapter_of=(lambda params: loras.text_encoder_adapter(params.lora, params.lora_scale)) if loras else None,
            encoding_with=loras.encoding_with if loras else None,
            on_result=on_encoded,
        )
        self.timer = DeviceTimer(model.device)
        self.preview_maker = PreviewMaker(model) if model.latent_rgb is not None else None  # None: no previews
        self.previews: list[tuple[str, PreviewPixels]] = []  # (sample_id, its preview) made since the last take
        self.has_failed_preview = False  # log the first failure only

    @property
    def beside_the_loop(self) -> tuple[Encoder, Decoder]:
        """The parts that may run on a worker thread of their own."""
        return self.encoder, self.decoder

    def take_previews(self) -> list[tuple[str, PreviewPixels]]:
        previews, self.previews = self.previews, []
        return previews

    def reset(self) -> None:
        """Forget every sample and buffer (after an engine error failed them all)."""
        self.samples.clear()
        self.input_batches.clear()
        self.previews.clear()
        self.row_caps = RowCaps()
        self.timer.discard()
        self.decoder.discard(self.decoder.pending)
        self.encoder.discard(self.encoder.pending.keys())

    def close(self) -> None:
        self.encoder.close()
        self.decoder.close()

    @torch.inference_mode()
    def execute(self, plan: SchedulerPlan, aborted_since: AbortedSince = tuple) -> RunnerOutput:
        output = RunnerOutput()
        self._drop(plan.aborted_sample_ids)
        for batch_key in list(self.input_batches):
            if batch_key[0] not in plan.groups:
                del self.input_batches[batch_key]
        self.row_caps.keep_only(plan.groups)  # a drained group freed its memory
        with self.phases.phase("start"):
            if plan.new_samples:
                self._admit(plan.new_samples, output)
            self._collect_started(output)  # samples still starting (prompts encoding) skip this iteration's forwards
        output.num_samples_starting = sum(
            sample_id in self.encoder.pending for sample_ids in plan.groups.values() for sample_id in sample_ids
        )
        finished: list[SampleTensors] = []
        for key, sample_ids in plan.groups.items():
            self._drop(aborted_since())
            samples = [self.samples[sample_id] for sample_id in sample_ids if sample_id in self.samples]
            if samples:
                finished += self._run_group(key, samples, output)
        self._drop(aborted_since())
        finished = [sample for sample in finished if sample.sample_id in self.samples]
        with self.phases.phase("decode"):
            if finished:
                self._hand_to_decoder(finished, output)
            self._collect_decoded(output)
        output.forward_seconds = self.timer.collect()
        return output

    def _drop(self, sample_ids: Collection[str]) -> None:
        for sample_id in sample_ids:
            self.samples.pop(sample_id, None)
        self.encoder.discard(sample_ids)

    def _admit(self, new_samples: Sequence[Sample], output: RunnerOutput) -> None:
        """Load the new samples' adapters (here: they change the model) and hand them to the encoder."""
        starting: list[Sample] = []
        for new in new_samples:
            try:
                if new.params.lora is not None:  # the ones admitted with it are in use too
                    self._prepare_lora(new.params.lora, also_in_use=[sample.params.lora for sample in starting])
            except LoraError as e:
                output.failed[new.sample_id] = str(e)
                continue
            starting.append(new)
        self.encoder.submit(starting)

    def _collect_started(self, output: RunnerOutput) -> None:
        for result in self.encoder.collect():
            output.encode_seconds += result.seconds
            output.failed.update(result.failed)
            for sample in result.samples:
                sample.step_cache = self._step_cache_state(sample)
                self.samples[sample.sample_id] = sample

    def _step_cache_state(self, sample: SampleTensors) -> StepCacheState | None:
        """The sample's own step cache, or None where it does not cache."""
        params = sample.params
        threshold = sample_threshold(
            self.default_cache if params.cache is None else params.cache,
            self.cache_kind,
            params.guidance_scale,
            FAMILIES[self.model.family].default_guidance,
            has_guidance_rows=sample.num_rows > 1,
        )
        if threshold is None:
            return None
        assert self.cache_kind is not None
        return StepCacheState(threshold, num_final_steps(self.cache_kind, sample.sample.num_steps))

    def _prepare_lora(self, name: str, also_in_use: Sequence[str | None]) -> None:
        assert self.loras is not None, "the engine refuses adapters without a LoRA store"
        if self.loras.cache.is_loaded(name):
            return
        starting = [new.params.lora for new in self.encoder.pending.values()]
        in_use = [sample.params.lora for sample in self.samples.values()] + starting + list(also_in_use)
        with self.encoder.model_lock:  # loading (or evicting) changes the text encoder the encoder may be running
            self.loras.prepare(name, in_use={lora for lora in in_use if lora is not None})

    def _run_group(
        self, key: CompatibilityKey, samples: list[SampleTensors], output: RunnerOutput
    ) -> list[SampleTensors]:
        chunks = self.row_caps.chunks(key, samples, lambda sample: sample.num_rows)
        try:
            outcome = run_splitting(
                chunks, lambda chunk: self._forward(key, chunk, output), rows_of=_rows_of, device=self.model.device
            )
        except Exception as e:
            logger.exception("denoiser forward failed for group %s", key)
            self._drop_input_batches(key)
            for sample in samples:
                self._fail(sample, f"denoiser forward failed for {key}: {_describe(e)}", output)
            return []
        if outcome.num_splits:
            self._drop_input_batches(key)  # chunk buffers of the old split are stale
            output.num_oom_splits += outcome.num_splits
            self.row_caps.lower(key, outcome.largest_fit)
            largest = max((len(chunk) for chunk, _ in outcome.results), default=0)
            if largest:
                output.admission_caps[key] = largest
        for sample, error in outcome.failed:
            self._fail(sample, alone_message(f"a forward of {key}", sample.num_rows, error), output)
        finished = []
        with self.phases.phase("sampler"):
            for chunk, guided in outcome.results:
                finished += self._step_chunk(chunk, guided, output)
        return finished

    def _step_chunk(
        self, samples: list[SampleTensors], guided: list[torch.Tensor], output: RunnerOutput
    ) -> list[SampleTensors]:
        """Step each sample once: those of a kind that steps together in one go (batching.batched_steps), the
        rest (and a kind whose batched step failed) one by one. The samples that ran their last step."""
        by_kind: dict[tuple, list[int]] = {}
        for index, (sample, prediction) in enumerate(zip(samples, guided)):
            if (kind := batch_kind(sample, prediction)) is not None:
                by_kind.setdefault(kind, []).append(index)
        stepped: list[Stepped | None] = [None] * len(samples)
        for indices in by_kind.values():
            try:
                results = step_together([samples[i] for i in indices], [guided[i] for i in indices])
            except Exception:
                logger.exception("a batched sampler step failed; stepping its %d samples one by one", len(indices))
                continue
            for index, result in zip(indices, results):
                stepped[index] = result
        return [
            sample
            for sample, prediction, result in zip(samples, guided, stepped)
            if self._step(sample, prediction, output, result) and sample.is_finished
        ]

    def _lora_rows(self, samples: list[SampleTensors], num_buffer_rows: int) -> contextlib.AbstractContextManager:
        """Each row's adapter for the group's forward (padding rows: none)."""
        if all(sample.params.lora is None for sample in samples):
            return contextlib.nullcontext()
        row_adapters = [
            (sample.params.lora, sample.params.lora_scale) for sample in samples for _ in range(sample.num_rows)
        ]
        row_adapters += [(None, 0.0)] * (num_buffer_rows - len(row_adapters))
        assert self.loras is not None  # the engine refuses adapters without a LoRA store
        return self.loras.rows(row_adapters)

    def _forward(self, key: CompatibilityKey, samples: list[SampleTensors], output: RunnerOutput) -> list:
        """One denoiser call over `samples` (one chunk of the group): each sample's guided prediction."""
        # A capped group runs in chunks, each with its own buffers (refilled only when its membership changes).
        batch_key = (key, samples[0].sample_id) if key in self.row_caps.rows_by_key else (key, "")
        input_batch = self.input_batches.get(batch_key)
        if input_batch is None:
            input_batch = InputBatch(self.model, row_buckets=self.row_buckets)
            self.input_batches[batch_key] = input_batch
        phases = self.phases
        if input_batch.sample_ids != tuple(sample.sample_id for sample in samples):
            phases.mark_churn()
        span = self.timer.start()
        try:
            with phases.phase("inputs"):
                forward_batch = input_batch.prepare(samples)
            num_buffer_rows = len(forward_batch.timesteps)
            with phases.phase("forward"), self._lora_rows(samples, num_buffer_rows):
                mark_forward_start(self.compile_mode, self.model.device)
                predictions = self._denoise(forward_batch, samples, output)  # [num_buffer_rows, *latent_shape]
            with phases.phase("guidance"):
                guided = guided_predictions(self.model, predictions, samples)  # batching.batched_steps
        except Exception:
            del self.input_batches[batch_key]
            raise
        self.timer.stop(span)
        output.num_tokens_computed += forward_batch.num_positions
        output.num_tokens_padded += forward_batch.num_padded_positions
        output.rows_per_forward.append(input_batch.num_rows)
        output.samples_per_forward.append(len(samples))
        output.sizes_per_forward.append(len({(sample.params.height, sample.params.width) for sample in samples}))
        output.loras_per_forward.append(len({sample.params.lora for sample in samples} - {None}))
        return guided

    def _denoise(self, batch: ForwardBatch, samples: list[SampleTensors], output: RunnerOutput):
        """The model's forward, or its step-cached forward when a sample of it caches (batching.step_cache)."""
        if self.step_caching is None:
            return self.model.forward(batch)
        caching = self.step_caching
        num_rows = sum(sample.num_rows for sample in samples)
        # In deterministic mode every forward takes the cached path, cache or not: a family's plain forward may
        # run other kernels for the same rows (diffusers' own forward for rows of one shape, packed blocks in
        # the cached one), and an uncached job's bits must not depend on whether a batch mate caches.
        if all(sample.step_cache is None for sample in samples) and not self.is_deterministic:
            predictions = self.model.forward(batch)
            output.num_cache_blocks += num_rows * caching.num_cache_blocks
            return predictions
        cached = [CachedSample(sample.num_rows, sample.step_cache, sample.may_skip_step) for sample in samples]
        # Gathering the computing rows changes the batch size (not in deterministic mode) and the row order
        # per-row adapters are bound to.
        may_gather = not self.is_deterministic and all(sample.params.lora is None for sample in samples)
        result = caching.forward_cached(batch, cached, may_gather=may_gather)
        output.num_cache_blocks += num_rows * caching.num_cache_blocks
        for sample, is_skip in zip(samples, result.skipped):
            if is_skip:
                output.num_cache_steps_skipped += 1
                output.num_cache_blocks_skipped += sample.num_rows * (
                    caching.num_cache_blocks - caching.num_blocks_kept
                )
        return result.predictions

    def _step(self, sample: SampleTensors, prediction, output: RunnerOutput, stepped: Stepped | None = None) -> bool:
        """Advance the sample by its sampler's step (already taken with others when `stepped` is given)."""
        try:
            if stepped is None:
                stepped = sample.sampler.step(
                    prediction, sample.host_timestep, sample.latents, generator=sample.generator, return_dict=False
                )  # (next latents,) or, for samplers that estimate it (DDIM, Euler), (next latents, final latents)
            sample.latents = stepped[0]
            sample.sample.num_steps_done += 1  # the one count of a sample's steps: everything else reads it
            blend_unmasked(self.model, sample)  # inpainting only
        except Exception as e:
            logger.exception("sampler step failed for sample %s", sample.sample_id)
            self._fail(sample, f"{sample.params.sampler} sampler step failed: {_describe(e)}", output)
            return False
        output.stepped_sample_ids.append(sample.sample_id)
        every = sample.sample.preview_every
        if every and sample.num_steps_done % every == 0 and not sample.is_finished:
            self._preview(sample, stepped[1] if len(stepped) > 1 else sample.latents)
        return True

    def _preview(self, sample: SampleTensors, latents: torch.Tensor) -> None:
        """A live preview of `latents`: the sampler's estimate of the final latents where it makes one (a
        clearer picture early on), its current latents otherwise. A failure costs the preview, not the sample."""
        if self.preview_maker is None:
            return
        try:
            self.previews.append((sample.sample_id, self.preview_maker.make(latents, sample.params)))
        except Exception:
            if not self.has_failed_preview:
                logger.exception("a live preview of sample %s failed; the sample goes on", sample.sample_id)
            self.has_failed_preview = True

    def _drop_input_batches(self, key: CompatibilityKey) -> None:
        for batch_key in [batch_key for batch_key in self.input_batches if batch_key[0] == key]:
            del self.input_batches[batch_key]

    def _hand_to_decoder(self, samples: list[SampleTensors], output: RunnerOutput) -> None:
        """The samples leave the runner now; their images arrive through `_collect_decoded`."""
        batches = self._decode_batches(samples)
        for sample in samples:
            del self.samples[sample.sample_id]
            output.denoised_sample_ids.append(sample.sample_id)
        self.decoder.submit(batches)

    def _collect_decoded(self, output: RunnerOutput) -> None:
        """The decode batches done since the last call: their images went to the engine already (`on_images`)."""
        for result in self.decoder.collect():
            output.failed.update(result.failed)
            output.finished_sample_ids += result.images.keys()

    def _decode_batches(self, samples: list[SampleTensors]) -> list[list[SampleTensors]]:
        if self.is_deterministic:
            return [[sample] for sample in samples]
        by_size: dict[tuple[int, int, int], list[SampleTensors]] = {}  # (height, width, frames) -> its samples
        for sample in samples:
            by_size.setdefault((sample.params.height, sample.params.width, sample.params.num_frames), []).append(sample)
        return list(by_size.values())

    def _fail(self, sample: SampleTensors, message: str, output: RunnerOutput) -> None:
        output.failed[sample.sample_id] = message
        self.samples.pop(sample.sample_id, None)


def _rows_of(samples: list[SampleTensors]) -> int:
    return sum(sample.num_rows for sample in samples)


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"
