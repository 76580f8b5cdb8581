"""The model runner: executes a scheduler plan on the model and reports plain results.

It owns every running job's tensors (sampler, generator, latents, prompt embeddings)
and one `InputBatch` per group. Per plan: drop freed jobs, encode the new jobs' prompts
in one text-encoder call, run one denoiser forward per group, step each job's own
sampler, decode the jobs that finished. A failure is contained: an exception in a
group's forward fails that group's jobs, one in a job's sampler step or decode fails
that job, and the runner keeps serving the rest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch
from diffusers.utils.torch_utils import randn_tensor

from batching.input_batch import InputBatch
from batching.sample_tensors import SampleTensors
from batching.params import CompatibilityKey
from batching.pipelines import StableDiffusionAdapter
from batching.plan import NewJob, RunnerOutput, SchedulerPlan

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, model: StableDiffusionAdapter, *, max_num_seqs: int, is_deterministic: bool = False) -> None:
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.is_deterministic = is_deterministic
        # Deterministic mode fixes every batch size: forwards carry 2 rows per job slot,
        # the text encoder sees fixed-size chunks, and the VAE decodes one image at a time.
        self.num_padded_rows = 2 * max_num_seqs if is_deterministic else None
        self.jobs: dict[str, SampleTensors] = {}
        self.input_batches: dict[CompatibilityKey, InputBatch] = {}

    @torch.inference_mode()
    def execute(self, plan: SchedulerPlan) -> RunnerOutput:
        output = RunnerOutput()
        for job_id in plan.freed_job_ids:
            self.jobs.pop(job_id, None)
        for key in list(self.input_batches):
            if key not in plan.groups:
                del self.input_batches[key]
        if plan.new_jobs:
            self._admit(plan.new_jobs, output)
        finished: list[SampleTensors] = []
        for key, job_ids in plan.groups.items():
            jobs = [self.jobs[job_id] for job_id in job_ids if job_id in self.jobs]
            if jobs:
                finished += self._run_group(key, jobs, output)
        if finished:
            self._decode(finished, output)
        return output

    def _admit(self, new_jobs: Sequence[NewJob], output: RunnerOutput) -> None:
        start = time.perf_counter()
        texts = sorted({text for new_job in new_jobs for text in _prompts_of(new_job)})
        try:
            embeds = self._encode(texts)  # [len(texts), seq, dim]
        except Exception as e:
            logger.exception("text encoder failed")
            for new_job in new_jobs:
                output.failed[new_job.job_id] = f"prompt encoding failed: {_describe(e)}"
            return
        row_of = {text: row for row, text in enumerate(texts)}
        output.encode_seconds = time.perf_counter() - start
        for new_job in new_jobs:
            params = new_job.params
            try:
                sampler = self.model.new_sampler(params.sampler, params.num_inference_steps)
                generator = torch.Generator("cpu").manual_seed(params.seed)
                shape = (1, *self.model.latent_shape(params.height, params.width))
                noise = randn_tensor(shape, generator=generator, device=self.model.device, dtype=self.model.dtype)
                self.jobs[new_job.job_id] = SampleTensors(
                    job_id=new_job.job_id,
                    params=params,
                    sampler=sampler,
                    generator=generator,
                    latents=noise * sampler.init_noise_sigma,  # [1, c, h/8, w/8]
                    cond_embeds=embeds[row_of[params.prompt]],
                    uncond_embeds=embeds[row_of[params.negative_prompt]] if params.has_guidance else None,
                )
            except Exception as e:
                logger.exception("could not start job %s", new_job.job_id)
                output.failed[new_job.job_id] = f"could not start the job: {_describe(e)}"

    def _encode(self, texts: list[str]) -> torch.Tensor:
        if not self.is_deterministic:
            return self.model.encode_prompts(texts)[0]
        chunk_size = self.num_padded_rows
        chunks = []
        for start in range(0, len(texts), chunk_size):
            chunk = texts[start : start + chunk_size]
            padded = chunk + [""] * (chunk_size - len(chunk))
            chunks.append(self.model.encode_prompts(padded)[0][: len(chunk)])
        return torch.cat(chunks)

    def _run_group(self, key: CompatibilityKey, jobs: list[SampleTensors], output: RunnerOutput) -> list[SampleTensors]:
        try:
            input_batch = self.input_batches.get(key)
            if input_batch is None:
                input_batch = InputBatch(device=self.model.device, dtype=self.model.dtype, num_padded_rows=self.num_padded_rows)
                self.input_batches[key] = input_batch
            start = time.perf_counter()
            latents, timesteps, embeds = input_batch.prepare(jobs)
            noise_pred = self.model.forward(latents, timesteps, embeds)  # [num_buffer_rows, c, h/8, w/8]
            predictions = input_batch.guided_predictions(noise_pred, jobs)
            self._synchronize()
            output.forward_seconds.append(time.perf_counter() - start)
            output.rows_per_forward.append(input_batch.num_rows)
        except Exception as e:
            logger.exception("denoiser forward failed for group %s", key)
            self.input_batches.pop(key, None)
            for job in jobs:
                self._fail(job, f"denoiser forward failed for {key}: {_describe(e)}", output)
            return []
        finished = []
        for job, prediction in zip(jobs, predictions):
            try:
                job.latents = job.sampler.step(
                    prediction, job.timestep, job.latents, generator=job.generator, return_dict=False
                )[0]
                job.num_steps_done += 1
            except Exception as e:
                logger.exception("sampler step failed for job %s", job.job_id)
                self._fail(job, f"{job.params.sampler} sampler step failed: {_describe(e)}", output)
                continue
            output.stepped_job_ids.append(job.job_id)
            if job.is_finished:
                finished.append(job)
        return finished

    def _decode(self, jobs: list[SampleTensors], output: RunnerOutput) -> None:
        start = time.perf_counter()
        for batch in self._decode_batches(jobs):
            try:
                images = self.model.decode(torch.cat([job.latents for job in batch]))
            except Exception as e:
                logger.exception("decode failed")
                for job in batch:
                    self._fail(job, f"decoding the image failed: {_describe(e)}", output)
                continue
            for job, image in zip(batch, images):
                output.finished_job_ids.append(job.job_id)
                output.images[job.job_id] = image
                del self.jobs[job.job_id]
        output.decode_seconds = time.perf_counter() - start

    def _decode_batches(self, jobs: list[SampleTensors]) -> list[list[SampleTensors]]:
        if self.is_deterministic:
            return [[job] for job in jobs]
        by_shape: dict[tuple[int, ...], list[SampleTensors]] = {}
        for job in jobs:
            by_shape.setdefault(tuple(job.latents.shape), []).append(job)
        return list(by_shape.values())

    def _fail(self, job: SampleTensors, message: str, output: RunnerOutput) -> None:
        output.failed[job.job_id] = message
        self.jobs.pop(job.job_id, None)

    def _synchronize(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)


def _prompts_of(new_job: NewJob) -> list[str]:
    params = new_job.params
    return [params.prompt, params.negative_prompt] if params.has_guidance else [params.prompt]


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"
