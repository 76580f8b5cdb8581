"""The four ways of serving a workload that the suite compares, each behind `open / run / close`.

- serial: the stepwise engine with `max_num_seqs=1` (the step-wise path, no batching);
- static: what a user does without stepwise: diffusers' own pipeline for the model's
  family (`StableDiffusionPipeline`, `StableDiffusionXLPipeline`, `FluxPipeline`,
  `ZImagePipeline`, `StableDiffusion3Pipeline`) called with prompt lists and one generator per request, a group at a
  time, each group running to completion before the next starts;
- fifo: the engine with the `fifo` policy (the reference: one key at a time, head-of-line blocking);
- default: the engine with the default policy.

Arrivals follow the workload's schedule in every variant. Static batching's rule: a
pipeline call takes one height, width, step count, guidance scale and sampler, so
requests are grouped by that static key. The queue is kept in arrival order; the
batcher takes the oldest waiting request's key and launches a group of up to N waiting
requests with that key (wherever they stand in the queue) as soon as N of them wait or
the oldest has waited `timeout` seconds. It never runs two groups at once.
"""

from __future__ import annotations

import functools
import inspect
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from batching import DiffusionEngine, EngineConfig, GenerationParams
from batching.job import JobFuture
from benchmarks.component_times import ForwardShape, ForwardTrace, UNetRowCounter, time_forwards
from benchmarks.workloads import Workload
from core.families import FAMILIES

WARM_UP_STEPS = 2


@dataclass(frozen=True)
class VariantSpec:
    name: str  # "serial", "static", "fifo", "default"
    kind: str  # "engine" or "static"
    max_num_seqs: int  # engine running capacity, or the static group size
    policy: str | None = None  # engine admission policy
    max_num_tokens: int | None = None  # engine token budget; None: the engine's default


def variant_specs(max_num_seqs: int, max_num_tokens: int | None = None) -> list[VariantSpec]:
    """`max_num_tokens` gives the batching engines static batching's capacity: a group of `max_num_seqs`
    jobs of the largest size (the engine's default budget counts `max_num_seqs` at the default size)."""
    return [
        VariantSpec("serial", "engine", 1, "default"),
        VariantSpec("static", "static", max_num_seqs),
        VariantSpec("fifo", "engine", max_num_seqs, "fifo", max_num_tokens),
        VariantSpec("default", "engine", max_num_seqs, "default", max_num_tokens),
    ]


@dataclass
class JobTiming:
    index: int  # position in the workload
    submitted: float  # seconds since the run started
    started: float  # first denoise step (engine) or group start (static)
    finished: float  # result available
    queue_wait: float  # started - submitted
    service: float  # finished - started: denoise + decode (engine) or the whole group call (static)
    height: int
    width: int
    num_steps: int
    guidance_scale: float


@dataclass
class RunRecord:
    workload: Workload
    variant: VariantSpec
    jobs: list[JobTiming]
    wall_seconds: float  # first submit to last result
    load_average_start: tuple[float, float, float]
    load_average_end: tuple[float, float, float]
    engine_stats: dict = field(default_factory=dict)  # engine: stats() difference over the run
    trace: dict | None = None  # engine: ForwardTrace.as_dict()
    forward_times: dict[ForwardShape, float] = field(default_factory=dict)  # engine: bare-UNet seconds per shape run
    static_forwards: dict[int, int] = field(default_factory=dict)  # static: rows -> UNet calls
    static_groups: list[int] = field(default_factory=list)  # static: requests in each pipeline call


def _call_with_index(callback: Callable[[Future, int], None], index: int, future: Future) -> None:
    callback(future, index)


def _seed_of(params: GenerationParams) -> int:
    if params.seed is None:
        raise ValueError("a benchmark's jobs carry their seeds, so every variant draws the same images")
    return params.seed


def sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


class EngineVariant:
    def __init__(self, spec: VariantSpec, model: str, device: str, num_threads: int, forward_repeats: int = 3) -> None:
        self.spec = spec
        self.forward_repeats = forward_repeats  # bare-UNet timings per shape, right after each run
        self.config = EngineConfig(
            model=model,
            device=device,
            max_num_seqs=spec.max_num_seqs,
            policy=spec.policy or "default",
            num_threads=num_threads,
            max_num_tokens=spec.max_num_tokens,
        )
        self.engine: DiffusionEngine | None = None
        self.trace = ForwardTrace()

    def open(self, sizes: list[tuple[int, int]]) -> None:
        self.engine = DiffusionEngine(self.config)
        self.trace.attach(self.engine)
        for height, width in sizes:
            futures = [
                self.engine.submit(params)
                for params in _warm_up_group(self.config.model, height, width, self.spec.max_num_seqs)
            ]
            for future in futures:
                future.result()

    @property
    def opened_engine(self) -> DiffusionEngine:
        if self.engine is None:
            raise RuntimeError("open() the variant before running it")
        return self.engine

    @property
    def adapter(self):
        return self.opened_engine.model_runner.model

    def run(self, workload: Workload) -> RunRecord:
        engine = self.opened_engine
        self.trace.reset()
        before = engine.stats()
        load_start = _load_average()
        submitted: dict[int, float] = {}
        finished: dict[int, float] = {}
        futures: dict[int, JobFuture] = {}
        num_done = threading.Semaphore(0)  # a Future wakes result() before it runs its done callbacks

        def on_done(_: Future, index: int) -> None:
            finished[index] = time.perf_counter() - t0
            num_done.release()

        t0 = time.perf_counter()
        for index, arrival in enumerate(workload.arrivals):
            sleep_until(t0 + arrival.at_seconds)
            submitted[index] = time.perf_counter() - t0
            future = engine.submit(arrival.params, job_id=f"{workload.name}-{index}")
            future.add_done_callback(functools.partial(_call_with_index, on_done, index))
            futures[index] = future
        for _ in futures:
            num_done.acquire()
        jobs = []
        for index, future in futures.items():
            result = future.result()
            params = workload.arrivals[index].params
            started = submitted[index] + result.timings["queue_wait"]
            jobs.append(
                JobTiming(
                    index,
                    submitted[index],
                    started,
                    finished[index],
                    result.timings["queue_wait"],
                    finished[index] - started,
                    params.height,
                    params.width,
                    params.num_inference_steps,
                    params.guidance_scale,
                )
            )
        wall = max(job.finished for job in jobs) - min(job.submitted for job in jobs)
        load_end = _load_average()
        stats = _stats_delta(before, engine.stats())
        trace = self.trace.as_dict()
        shapes = {(f["height"], f["width"], f["rows"]) for f in trace["forwards"]}
        forward_times = time_forwards(self.adapter, shapes, self.forward_repeats)
        return RunRecord(
            workload,
            self.spec,
            jobs,
            wall,
            load_start,
            load_end,
            engine_stats=stats,
            trace=trace,
            forward_times=forward_times,
        )

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


@dataclass
class _Waiting:
    index: int
    params: GenerationParams
    submitted: float  # seconds since the run started


class StaticBatchVariant:
    def __init__(self, spec: VariantSpec, model: str, device: str, num_threads: int, timeout_seconds: float) -> None:
        self.spec = spec
        self.model = model
        self.device = device
        self.num_threads = num_threads
        self.timeout_seconds = timeout_seconds  # the oldest request waits at most this long for a full group
        self.pipeline: Any = None  # the family's diffusers pipeline, once open
        self.family = ""
        self.guidance_argument = "guidance_scale"  # the argument of the family's pipeline that guidance_scale is
        self.row_counter: UNetRowCounter | None = None  # once open

    def open(self, sizes: list[tuple[int, int]]) -> None:
        from batching.model_loading import model_source
        from batching.pipelines import adapter_serving, resolve_device, resolve_dtype

        torch.set_num_threads(self.num_threads)
        device = resolve_device(self.device)
        source = model_source(self.model)
        adapter = adapter_serving(self.model, source)
        self.family = adapter.family
        self.guidance_argument = adapter.guidance_argument
        self.pipeline = adapter.load_pipeline(self.model, source, device, resolve_dtype("auto", device))
        self.pipeline.set_progress_bar_config(disable=True)
        self.row_counter = UNetRowCounter(getattr(self.pipeline, "unet", None) or self.pipeline.transformer)
        for height, width in sizes:
            self._call(_warm_up_group(self.model, height, width, self.spec.max_num_seqs))

    def run(self, workload: Workload) -> RunRecord:
        torch.set_num_threads(self.num_threads)
        row_counter = self.row_counter
        if row_counter is None:
            raise RuntimeError("open() the variant before running it")
        row_counter.reset()
        load_start = _load_average()
        arrivals: queue.Queue[_Waiting] = queue.Queue()
        t0 = time.perf_counter()
        driver = threading.Thread(target=self._drive, args=(workload, arrivals, t0), daemon=True)
        driver.start()
        waiting: list[_Waiting] = []
        jobs: list[JobTiming] = []
        groups: list[int] = []
        while len(jobs) < workload.num_jobs:
            group = self._next_group(waiting, arrivals, t0)
            started = time.perf_counter() - t0
            self._call([w.params for w in group])
            finished = time.perf_counter() - t0
            groups.append(len(group))
            for w in group:
                p = w.params
                jobs.append(
                    JobTiming(
                        w.index,
                        w.submitted,
                        started,
                        finished,
                        started - w.submitted,
                        finished - started,
                        p.height,
                        p.width,
                        p.num_inference_steps,
                        p.guidance_scale,
                    )
                )
        driver.join()
        jobs.sort(key=lambda job: job.index)
        wall = max(job.finished for job in jobs) - min(job.submitted for job in jobs)
        return RunRecord(
            workload,
            self.spec,
            jobs,
            wall,
            load_start,
            _load_average(),
            static_forwards=dict(sorted(row_counter.forwards.items())),
            static_groups=groups,
        )

    def close(self) -> None:
        self.pipeline = None

    @staticmethod
    def _drive(workload: Workload, arrivals: queue.Queue, t0: float) -> None:
        for index, arrival in enumerate(workload.arrivals):
            sleep_until(t0 + arrival.at_seconds)
            arrivals.put(_Waiting(index, arrival.params, time.perf_counter() - t0))

    def _next_group(self, waiting: list[_Waiting], arrivals: queue.Queue, t0: float) -> list[_Waiting]:
        """Block until the static rule launches a group; remove it from `waiting` and return it."""
        while True:
            while not arrivals.empty():
                waiting.append(arrivals.get_nowait())
            if waiting:
                head_key = _static_key(waiting[0].params)
                same = [w for w in waiting if _static_key(w.params) == head_key][: self.spec.max_num_seqs]
                waited = time.perf_counter() - t0 - waiting[0].submitted
                if len(same) == self.spec.max_num_seqs or waited >= self.timeout_seconds:
                    for w in same:
                        waiting.remove(w)
                    return same
                timeout = self.timeout_seconds - waited
            else:
                timeout = None
            try:
                waiting.append(arrivals.get(timeout=timeout))
            except queue.Empty:
                pass

    def _call(self, group: list[GenerationParams]) -> None:
        from batching.samplers import SAMPLER_CLASSES

        first = group[0]
        if FAMILIES[self.family].samplers != ("euler",):  # UNet families: the requested sampler
            sampler_class, overrides = SAMPLER_CLASSES[first.sampler]
            self.pipeline.scheduler = sampler_class.from_config(self.pipeline.scheduler.config, **overrides)
        # Flux2KleinPipeline takes no negative prompt (its unconditional one is always empty): same rows, same cost.
        takes_negative = "negative_prompt" in inspect.signature(self.pipeline.__call__).parameters
        negative = (
            {"negative_prompt": [p.negative_prompt for p in group]}
            if takes_negative and any(p.negative_prompt for p in group)
            else {}
        )
        self.pipeline(
            prompt=[p.prompt for p in group],
            height=first.height,
            width=first.width,
            num_inference_steps=first.num_inference_steps,
            generator=[torch.Generator("cpu").manual_seed(_seed_of(p)) for p in group],
            **{self.guidance_argument: first.guidance_scale},
            output_type="pil",
            **negative,
        )


def _warm_up_group(model: str, height: int, width: int, num_jobs: int) -> list[GenerationParams]:
    """A full batch of short jobs: the first forward at the largest batch size is slow, and not measured."""
    return [
        GenerationParams(
            prompt=f"warm-up {i}", seed=i, model=model, height=height, width=width, num_inference_steps=WARM_UP_STEPS
        )
        for i in range(num_jobs)
    ]


def _static_key(params: GenerationParams) -> tuple:
    """What one diffusers pipeline call holds fixed for all its prompts."""
    return (params.height, params.width, params.num_inference_steps, params.guidance_scale, params.sampler)


def _load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def _stats_delta(before: dict, after: dict) -> dict:
    delta = {}
    for name in ("forwards", "job_steps", "jobs_finished", "jobs_failed", "busy_seconds", "iterations"):
        delta[name] = after[name] - before[name]
    for name in ("rows_per_forward", "jobs_per_forward"):
        counts = {k: after[name].get(k, 0) - before[name].get(k, 0) for k in after[name]}
        delta[name] = {k: v for k, v in sorted(counts.items()) if v}
    return delta
