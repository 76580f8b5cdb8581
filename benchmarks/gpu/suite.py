"""The GPU suite: one prepared run that measures the engine on a GPU (benchmarks/gpu/run.sh calls it).

    python -m benchmarks.gpu.suite [--out DIR] [--budget-seconds 420]   # on a CUDA machine
    python -m benchmarks.gpu.suite --dry-run --out DIR                  # tiny sizes, one repetition, CPU

Per model (an SD-1.5-sized UNet at 512x512 and an SDXL-sized UNet at 1024x1024, random
weights built from configs by `benchmarks.gpu.models`, fp16):
- forward_ceiling: the bare denoiser forward at 1, 2, 4, 8, 16 rows (seconds, rows/s);
- throughput: serial (max_num_seqs=1) vs static (diffusers' pipeline, groups) vs default
  engine, on a burst and on Poisson arrivals at twice the serial capacity;
- invariance: the largest pixel difference between a job run alone and the same job run
  batched with others, in the run's dtype and in deterministic mode (expected: 0);
- decode_overlap: a mixed-step burst with decode beside the loop off and on: images/s
  and the denoiser-busy fraction;
- encode_overlap: jobs arriving one per step of a running job, their prompts encoded
  inline and beside the loop: the longest gap between two steps of a running job (max
  stall) against the median gap, and images/s.
Then (`benchmarks.gpu.transformers_alone`) forward_ceiling of a FLUX-sized transformer alone (the
whole FLUX pipeline is too large to build, save and load within the time), and a Wan 2.1 1.3B-sized video transformer
alone: videos batched vs one forward per video (serial), and videos of mixed sizes and frame
counts in one forward (packed: per-row positions, attention per row) vs each alone, with how far a mixed row's
prediction lies from its alone one. Sections run in that order while the
time budget lasts; one that does not fit is listed under "skipped", never silently left
out. Writes gpu_results.json and gpu_summary.md to the folder.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from batching import DiffusionEngine, EngineConfig, GenerationParams
from batching.engine import ENCODE_OVERLAP_DEFAULT
from benchmarks.component_times import time_forwards
from benchmarks.gpu.models import num_parameters, save_pipeline
from benchmarks.gpu.report import write_summary
from benchmarks.gpu.transformers_alone import flux_ceiling, free_device, wan_batching
from benchmarks.machine import describe_machine
from benchmarks.metrics import summarize
from benchmarks.variants import EngineVariant, StaticBatchVariant, VariantSpec
from benchmarks.workloads import JobShape, burst, mixed_steps, poisson

log = logging.getLogger("stepwise.bench.gpu")
POISSON_MULTIPLE = 2.0  # arrivals at twice the serial capacity: batching has work to share


@dataclass(frozen=True)
class ModelRun:
    name: str  # "sd15" or "sdxl" (benchmarks.gpu.models)
    size: int  # image pixels per side
    num_jobs: int
    num_steps: int
    max_num_seqs: int


@dataclass(frozen=True)
class Profile:
    device: str
    dtype: str
    scale: str  # "real" or "tiny"
    models: tuple[ModelRun, ...]
    repeats: int
    flux_size: int
    wan_videos: tuple[tuple[int, int, int], ...]  # (height, width, frames): the mixed rows; the first, the uniform
    rows: tuple[int, ...] = (1, 2, 4, 8, 16)
    wan_rows: tuple[int, ...] = (1, 2, 4)


GPU_RUNS = (ModelRun("sd15", 512, 16, 20, 8), ModelRun("sdxl", 1024, 8, 20, 8))
DRY_RUNS = (ModelRun("sd15", 64, 2, 2, 2), ModelRun("sdxl", 64, 2, 2, 2))
PROFILES = {
    "gpu": Profile(
        "cuda",
        "float16",
        "real",
        GPU_RUNS,
        repeats=3,
        flux_size=1024,
        # two seconds at 16 fps, 480p landscape and portrait, and one second at 480p and square
        wan_videos=((480, 832, 33), (832, 480, 33), (480, 832, 17), (480, 480, 17)),
    ),
    "dry-run": Profile(
        "cpu", "float32", "tiny", DRY_RUNS, repeats=1, flux_size=64, wan_videos=((64, 64, 9), (64, 96, 5), (96, 64, 13))
    ),
}


class Budget:
    def __init__(self, seconds: float) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds
        self.skipped: list[str] = []
        self.section_seconds: dict[str, float] = {}  # each started section's seconds, until the next one started
        self._current: tuple[str, float] | None = None

    def allows(self, section: str) -> bool:
        now = time.perf_counter()
        if self._current is not None:
            self.section_seconds[self._current[0]] = now - self._current[1]
        self._current = (section, now)
        if now - self.start < self.seconds:
            return True
        log.warning("time budget spent: skipping %s", section)
        self.skipped.append(section)
        return False


def run(profile: Profile, out: Path, budget: Budget) -> dict:
    results: dict = {
        "profile": asdict(profile),
        "machine": describe_machine(profile.device, torch.get_num_threads()),
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="stepwise-gpu-models-") as scratch:
        for model_run in profile.models:
            if budget.allows(model_run.name):
                results["models"][model_run.name] = run_model(profile, model_run, Path(scratch), budget)
                free_device(profile.device)
    if budget.allows("flux.forward_ceiling"):
        results["flux"] = {"forward_ceiling": flux_ceiling(profile)}
    if budget.allows("wan.batching"):
        results["wan"] = wan_batching(profile)
    budget.allows("end")
    results["skipped"] = [section for section in budget.skipped if section != "end"]
    results["section_seconds"] = budget.section_seconds
    results["total_seconds"] = time.perf_counter() - budget.start
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_results.json").write_text(json.dumps(results, indent=2, default=str))
    write_summary(results, out / "gpu_summary.md")
    return results


def run_model(profile: Profile, model_run: ModelRun, scratch: Path, budget: Budget) -> dict:
    start = time.perf_counter()
    folder = save_pipeline(
        model_run.name,
        profile.scale,
        scratch / model_run.name,
        torch.device(profile.device),
        getattr(torch, profile.dtype),
    )
    result: dict = {
        "run": asdict(model_run),
        "parameters": num_parameters(folder),
        "build_seconds": time.perf_counter() - start,
    }
    model = str(folder)
    log.info("%s built in %.1fs", model_run.name, result["build_seconds"])
    engines = _Engines(profile, model, model_run)
    try:
        if budget.allows(f"{model_run.name}.forward_ceiling"):
            adapter = engines.get("default").engine.model_runner.model
            shapes = {(model_run.size, model_run.size, rows) for rows in profile.rows}
            times = time_forwards(adapter, shapes, profile.repeats)
            one = times[(model_run.size, model_run.size, 1)]
            result["forward_ceiling"] = [
                {
                    "rows": rows,
                    "seconds": seconds,
                    "rows_per_second": rows / seconds,
                    "speedup_over_1_row": rows * one / seconds,
                }
                for (_, _, rows), seconds in sorted(times.items())
            ]
        if budget.allows(f"{model_run.name}.throughput"):
            result["throughput"] = throughput(engines, model, model_run)
        if budget.allows(f"{model_run.name}.invariance"):
            result["invariance"] = invariance(engines, profile, model, model_run)
        if budget.allows(f"{model_run.name}.decode_overlap"):
            result["decode_overlap"] = {
                name: mixed_burst(engines.plain(overlap), model, model_run)
                for name, overlap in (("off", False), ("on", True))
            }
        if budget.allows(f"{model_run.name}.encode_overlap"):
            result["encode_overlap"] = {
                name: arrivals_while_running(engines.plain(True, encode_overlap=overlap), model, model_run)
                for name, overlap in (("off", False), ("on", True))
            }
    finally:
        engines.close()
    return result


class _Engines:
    """The engines of one model, opened on first use and kept for the sections that share them."""

    def __init__(self, profile: Profile, model: str, model_run: ModelRun) -> None:
        self.profile, self.model, self.model_run = profile, model, model_run
        self.variants: dict[str, EngineVariant | StaticBatchVariant] = {}
        self.engines: dict[str, DiffusionEngine] = {}

    def get(self, name: str, static_timeout: float = 1.0):
        if name not in self.variants:
            threads = torch.get_num_threads()
            seqs = 1 if name == "serial" else self.model_run.max_num_seqs
            spec = VariantSpec(name, "static" if name == "static" else "engine", seqs, "default")
            variant = (
                StaticBatchVariant(spec, self.model, self.profile.device, threads, static_timeout)
                if name == "static"
                else EngineVariant(spec, self.model, self.profile.device, threads, 1)
            )
            variant.open([(self.model_run.size, self.model_run.size)])
            self.variants[name] = variant
        return self.variants[name]

    def plain(
        self, decode_overlap: bool | None = None, deterministic: bool = False, encode_overlap: bool | None = None
    ) -> DiffusionEngine:
        """An engine of its own; a deterministic one runs 4 samples (its forwards are padded to all of them).
        Encode overlap left to the device's default is spelled out, so the sections share engines where they can."""
        if encode_overlap is None:
            encode_overlap = ENCODE_OVERLAP_DEFAULT.get(torch.device(self.profile.device).type, True)
        name = f"overlap={decode_overlap},deterministic={deterministic},encode_overlap={encode_overlap}"
        if name not in self.engines:
            self.engines[name] = DiffusionEngine(
                EngineConfig(
                    model=self.model,
                    device=self.profile.device,
                    max_num_seqs=min(4, self.model_run.max_num_seqs) if deterministic else self.model_run.max_num_seqs,
                    decode_overlap=decode_overlap,
                    deterministic=deterministic,
                    encode_overlap=encode_overlap,
                )
            )
        return self.engines[name]

    def close(self) -> None:
        for variant in self.variants.values():
            variant.close()
        for engine in self.engines.values():
            engine.shutdown()
        self.variants.clear()
        self.engines.clear()


def throughput(engines: _Engines, model: str, model_run: ModelRun) -> dict:
    shape = JobShape(model=model, num_steps=model_run.num_steps, size=model_run.size)
    figures: dict = {"burst": {}, "poisson": {}}
    serial_burst = summarize(engines.get("serial").run(burst(shape, model_run.num_jobs)))
    serial_capacity = serial_burst["throughput_images_per_second"]
    arrivals = poisson(shape, model_run.num_jobs, serial_capacity * POISSON_MULTIPLE, POISSON_MULTIPLE)
    figures["poisson_rate_per_second"] = serial_capacity * POISSON_MULTIPLE
    for name in ("serial", "static", "default"):
        variant = engines.get(name, static_timeout=1.0 / serial_capacity)
        figures["burst"][name] = (
            serial_burst if name == "serial" else summarize(variant.run(burst(shape, model_run.num_jobs)))
        )
        figures["poisson"][name] = summarize(variant.run(arrivals))
        if name == "static":
            variant.close()  # frees its pipeline before the next engine loads
            del engines.variants[name]
            free_device(engines.profile.device)
    return figures


def invariance(engines: _Engines, profile: Profile, model: str, model_run: ModelRun) -> dict:
    """Largest per-pixel difference (0-255) between each job alone and the same job batched."""
    params = [
        GenerationParams(
            prompt=f"a harbour at dusk, view {i}",
            seed=50 + i,
            model=model,
            height=model_run.size,
            width=model_run.size,
            num_inference_steps=min(8, model_run.num_steps) - i % 2,
            guidance_scale=(7.5, 4.0)[i % 2],
            sampler="euler",
        )
        for i in range(4)
    ]
    alone_engine = engines.get("serial").engine
    batched_engine = engines.get("default").engine
    deterministic = engines.plain(deterministic=True)
    return {
        profile.dtype: _max_diff(
            [alone_engine.submit(p).result() for p in params],
            [f.result() for f in [batched_engine.submit(p) for p in params]],
        ),
        "deterministic": _max_diff(
            [deterministic.submit(p).result() for p in params],
            [f.result() for f in [deterministic.submit(p) for p in params]],
        ),
    }


def mixed_burst(engine: DiffusionEngine, model: str, model_run: ModelRun) -> dict:
    """Jobs of half, full and 1.5x the step count at once: finishes (and decodes) are staggered."""
    shape = JobShape(model=model, num_steps=model_run.num_steps, size=model_run.size)
    workload = mixed_steps(shape, model_run.num_jobs)
    engine.submit(workload.arrivals[0].params).result()  # warm-up
    before = engine.stats()
    start = time.perf_counter()
    for future in [engine.submit(arrival.params) for arrival in workload.arrivals]:
        future.result()
    wall = time.perf_counter() - start
    after = engine.stats()
    return {
        "decode_overlap": after["decode_overlap"],
        "wall_seconds": wall,
        "images_per_second": workload.num_jobs / wall,
        "denoiser_busy_fraction": (after["forward_seconds"] - before["forward_seconds"]) / wall,
        "engine_busy_fraction": (after["busy_seconds"] - before["busy_seconds"]) / wall,
        "decode_seconds_per_image": (after["decode_seconds"] - before["decode_seconds"]) / workload.num_jobs,
    }


def arrivals_while_running(engine: DiffusionEngine, model: str, model_run: ModelRun) -> dict:
    """A job runs; each of num_jobs/2 shorter jobs (long prompts) arrives after its next step, so new prompts are
    encoded while jobs run. Max stall: the longest gap between two consecutive steps of one job."""
    num_arrivals = max(1, model_run.num_jobs // 2)
    prompt = "a lighthouse on a cliff above a stormy sea at dusk, " * 6  # about the text encoder's 77 tokens

    def params(index: int, steps: int) -> GenerationParams:
        return GenerationParams(
            prompt=f"{prompt}view {index}",
            seed=70 + index,
            model=model,
            height=model_run.size,
            width=model_run.size,
            num_inference_steps=steps,
        )

    engine.submit(params(99, 1)).result()  # warm-up
    before = engine.stats()
    step_times: dict[int, list[float]] = {}
    futures = []

    def on_progress_of(index: int):
        times = step_times.setdefault(index, [])

        def on_progress(num_steps_done: int, num_steps_total: int) -> None:
            times.append(time.perf_counter())
            if index == 0 and num_steps_done <= num_arrivals:
                futures.append(
                    engine.submit(
                        params(num_steps_done, max(1, model_run.num_steps // 2)),
                        on_progress=on_progress_of(num_steps_done),
                    )
                )

        return on_progress

    start = time.perf_counter()
    first = engine.submit(params(0, max(model_run.num_steps, num_arrivals + 2)), on_progress=on_progress_of(0))
    first.result()
    for future in list(futures):
        future.result()
    wall = time.perf_counter() - start
    after = engine.stats()
    gaps = [later - earlier for times in step_times.values() for earlier, later in zip(times, times[1:])]
    return {
        "encode_overlap": after["encode_overlap"],
        "num_jobs": 1 + len(futures),
        "images_per_second": (1 + len(futures)) / wall,
        "max_stall_seconds": max(gaps),
        "median_step_gap_seconds": statistics.median(gaps),
        "encode_seconds_per_job": (after["encode_seconds"] - before["encode_seconds"]) / (1 + len(futures)),
    }


def _max_diff(results_a: list, results_b: list) -> int:
    import numpy as np

    return max(
        int(np.abs(np.asarray(a.image, dtype=np.int16) - np.asarray(b.image, dtype=np.int16)).max())
        for a, b in zip(results_a, results_b)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "benchmarks/results/gpu"))
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, one repetition, on the CPU")
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=420.0,
        help="start no section after this many seconds (sections already started finish)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --dry-run on the CPU")
    profile = PROFILES["dry-run" if args.dry_run else "gpu"]
    if args.dry_run:
        # One intra-op thread: with two on a 2-core CPU, the loop's forwards and the decode/encode threads' calls
        # share the pool and its work splits change with timing, so deterministic mode came out 1 level apart
        # alone vs batched on some runs (a CPU scheduling effect the GPU run, which the dry run rehearses, lacks).
        torch.set_num_threads(1)
    results = run(profile, args.out, Budget(args.budget_seconds))
    log.info(
        "wrote %s and %s in %.0fs (skipped: %s)",
        args.out / "gpu_results.json",
        args.out / "gpu_summary.md",
        results["total_seconds"],
        ", ".join(results["skipped"]) or "nothing",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
