"""The serving suite's three ways of serving a family's jobs on one in-memory model, and what each run measures.

- engine (serial: `max_num_seqs=1`; default: the product's defaults): a `DiffusionEngine` on the adapter of a
  pipeline built in memory (`benchmarks.gpu.serving_models`). The engine's own loading is bypassed (its
  `load_model` answers with that adapter: a benchmark probe; everything after loading is the engine's own).
- static: diffusers' own pipeline, the same object, called in groups by `benchmarks.variants`' static rule
  (up to `max_num_seqs` waiting jobs of one shape, or the oldest after a serial job's time).

Every run gives its throughput, each job's latency (submit to result), and the device time of the denoiser's
calls over the run's wall time (device busy: CUDA events around each call, read after the run; on the CPU
wall time): for the engine around the adapter's forward (input rows, the denoiser), for static around the
pipeline's denoiser module. An engine run also records Python's garbage collections during it (`gc_pauses`).
"""

from __future__ import annotations

import functools
import gc
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch

from batching import DiffusionEngine, EngineConfig, GenerationParams, model_loading
from batching.pipelines import adapter_class
from benchmarks.component_times import UNetRowCounter
from benchmarks.metrics import percentiles
from benchmarks.variants import StaticBatchVariant, VariantSpec
from benchmarks.workloads import Workload
from core.families import FAMILIES, UNET_SAMPLERS


@dataclass
class RunFigures:
    wall_seconds: float
    latencies: list[float]  # seconds, submit to result, per job in arrival order
    device_seconds: float  # the denoiser's device time during the run
    extra: dict[str, Any] = field(default_factory=dict)  # rows per forward, phases, static groups

    def summary(self) -> dict[str, Any]:
        """The run as serving.json states it (throughput, p50 and p95 latency)."""
        latency = percentiles(self.latencies)
        return {
            "throughput_images_per_second": len(self.latencies) / self.wall_seconds,
            "latency_seconds": {"p50": latency["p50"], "p95": latency["p95"]},
        }

    def details(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "wall_seconds": self.wall_seconds,
            "latency_all_seconds": percentiles(self.latencies),
            "device_busy": self.device_seconds / self.wall_seconds,
            **self.extra,
        }


class DeviceClock:
    """Sums the device time of calls it wraps: CUDA events around each, read once the run is over."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._spans: list[tuple[Any, Any]] = []
        self._seconds = 0.0

    def start(self) -> Any:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, started: Any) -> None:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._spans.append((started, event))
        else:
            self._seconds += time.perf_counter() - started

    def take(self) -> float:
        """Seconds since the last take (waits for the device: call it after a run, not during one)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._seconds += sum(start.elapsed_time(end) / 1000 for start, end in self._spans)
            self._spans.clear()
        seconds, self._seconds = self._seconds, 0.0
        return seconds

    def wrap(self, function: Callable) -> Callable:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = self.start()
            try:
                return function(*args, **kwargs)
            finally:
                self.stop(started)

        return timed


def in_memory_engine(adapter: Any, **config: Any) -> DiffusionEngine:
    """An engine serving `adapter` (its model built in memory), with `config`'s settings over the defaults."""
    with mock.patch.object(model_loading, "load_model", lambda *args, **kwargs: adapter):
        return DiffusionEngine(EngineConfig(model=adapter.model, device=str(adapter.device), **config))


@contextmanager
def gc_pauses(pauses: dict[str, float]) -> Iterator[None]:
    """Python's garbage collections while in the block, by generation: how many, and their seconds (a full
    collection walks every object the libraries loaded, and every thread waits for it)."""
    started: list[float] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            key = f"generation_{info['generation']}"
            pauses[f"{key}_count"] = pauses.get(f"{key}_count", 0) + 1
            pauses[f"{key}_seconds"] = pauses.get(f"{key}_seconds", 0.0) + time.perf_counter() - started.pop()

    gc.callbacks.append(record)
    try:
        yield
    finally:
        gc.callbacks.remove(record)


def run_engine(engine: DiffusionEngine, workload: Workload, clock: DeviceClock) -> RunFigures:
    """Submit the workload's arrivals on their schedule; every job's latency, the run's wall time and device time
    (a failed job fails the run, with its error)."""
    clock.take()
    before = engine.stats()
    engine.phases.reset()
    pauses: dict[str, float] = {}
    with gc_pauses(pauses):
        figures = _run_engine(engine, workload, clock, before)
    figures.extra["gc"] = pauses
    return figures


def _run_engine(engine: DiffusionEngine, workload: Workload, clock: DeviceClock, before: dict) -> RunFigures:
    finished: dict[int, float] = {}
    all_done = threading.Semaphore(0)
    started = time.perf_counter()
    submitted, futures = [], []
    for index, arrival in enumerate(workload.arrivals):
        delay = started + arrival.at_seconds - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        submitted.append(time.perf_counter())
        future = engine.submit(arrival.params)
        future.add_done_callback(functools.partial(_record_finish, finished, all_done, index))
        futures.append(future)
    for _ in futures:
        all_done.acquire()
    for future in futures:
        future.result()
    after = engine.stats()
    rows = {r: n - before["rows_per_forward"].get(r, 0) for r, n in after["rows_per_forward"].items()}
    extra: dict[str, Any] = {"rows_per_forward": {r: n for r, n in rows.items() if n}}
    if "phases" in after:
        extra["phases"] = after["phases"]
    latencies = [finished[index] - submitted[index] for index in range(len(futures))]
    return RunFigures(max(finished.values()) - started, latencies, clock.take(), extra)


def _record_finish(finished: dict[int, float], all_done: threading.Semaphore, index: int, future: Any) -> None:
    finished[index] = time.perf_counter()
    all_done.release()


class InMemoryStatic(StaticBatchVariant):
    """Static batching on the family's pipeline object (already on the device), video jobs included."""

    def __init__(self, pipeline: Any, family: str, group_size: int, timeout_seconds: float, clock: DeviceClock):
        super().__init__(
            VariantSpec("static", "static", group_size),
            model="",
            device=str(clock.device),
            num_threads=torch.get_num_threads(),
            timeout_seconds=timeout_seconds,
        )
        self.pipeline = pipeline
        self.family = family
        self.guidance_argument = adapter_class(family).guidance_argument
        pipeline.set_progress_bar_config(disable=True)
        self.denoiser = getattr(pipeline, "unet", None) or pipeline.transformer
        self.row_counter = UNetRowCounter(self.denoiser)
        self.clock = clock
        self._hooks = [
            self.denoiser.register_forward_pre_hook(lambda *args: self._starts.append(clock.start())),
            self.denoiser.register_forward_hook(lambda *args: clock.stop(self._starts.pop())),
        ]
        self._starts: list[Any] = []

    def measure(self, workload: Workload) -> RunFigures:
        self.clock.take()
        record = self.run(workload)
        latencies = [job.finished - job.submitted for job in sorted(record.jobs, key=lambda job: job.index)]
        extra = {"rows_per_forward": record.static_forwards, "groups": record.static_groups}
        return RunFigures(record.wall_seconds, latencies, self.clock.take(), extra)

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self.row_counter = None
        self.pipeline = None

    def _call(self, group: list[GenerationParams]) -> None:
        from batching.samplers import SAMPLER_CLASSES

        first = group[0]
        spec = FAMILIES[self.family]
        if spec.samplers == UNET_SAMPLERS:  # the UNet families: the requested sampler, as the engine runs it
            sampler_class, overrides = SAMPLER_CLASSES[first.sampler]
            self.pipeline.scheduler = sampler_class.from_config(self.pipeline.scheduler.config, **overrides)
        arguments: dict[str, Any] = {
            "prompt": [params.prompt for params in group],
            "height": first.height,
            "width": first.width,
            "num_inference_steps": first.num_inference_steps,
            "generator": [torch.Generator("cpu").manual_seed(params.seed or 0) for params in group],
            self.guidance_argument: first.guidance_scale,
            "output_type": "pil",
        }
        if spec.is_video:
            arguments["num_frames"] = first.num_frames
        if "negative_prompt" in inspect.signature(self.pipeline.__call__).parameters and first.negative_prompt:
            arguments["negative_prompt"] = [params.negative_prompt for params in group]
        self.pipeline(**arguments)


@contextmanager
def timing_forward(adapter: Any, clock: DeviceClock):
    """The adapter's forward timed by `clock` while in the block (every family's engine forward goes through it)."""
    adapter.forward = clock.wrap(type(adapter).forward.__get__(adapter))
    try:
        yield
    finally:
        del adapter.forward
