"""The serving suite: every family at real size on one GPU, served three ways (issue 42).

    benchmarks/gpu/run.sh "$OUT"                             # on the GPU machine (installs the carried wheels)
    python -m benchmarks.gpu.serving [--out DIR] [--budget-seconds 520] [--families sd15,flux]
    python -m benchmarks.gpu.serving --dry-run --out DIR     # tiny sizes on the CPU, seconds (make test runs it)

Families in order, the must-haves first (SD 1.5 at 512, SDXL at 1024, FLUX.1 at 1024, Qwen-Image at 1024,
Wan 2.1 1.3B at 480x832x33), then Z-Image and SD3.5 Large: a family starts only while its estimated time
is left of the budget (a must-have: 80% of it), and one that cannot start is listed as skipped. Each is
built in memory with random weights (`benchmarks.gpu.serving_models`) and served three ways
(`benchmarks.gpu.serving_variants`): serial (the engine, one job at a time), static (diffusers' pipeline in
groups) and default (the engine as shipped: its forward curve measured at start; its token budget static's
capacity, `capacity_tokens`; phase timing on for the profile), on a burst and on Poisson arrivals at 1x and
2x the serial capacity measured on the burst. The number of jobs is sized so a serial burst takes about
`SERIAL_BURST_SECONDS`. The transformer and video families also run a burst of mixed shapes against each
shape's jobs alone.

Writes, after each family: serving.json (the shape of DESIGN.md section 9, checked before writing:
`benchmarks.gpu.serving_report`), serving.md (its table), serving_details.json (per run: every latency
percentile, rows per forward, the engine's phase profile per workload, device syncs by thread and site
during the default engine's Poisson 2x run, the forward curve, one job alone through the engine and the
pipeline; then the denoiser compiled against eager for one job, if time is left).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import random
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from batching import GenerationParams
from batching.pipelines import adapter_class
from benchmarks.gpu.serving_models import REAL_MEMORY_GIB, build_model
from benchmarks.gpu.serving_report import VARIANTS, WORKLOADS, shape_errors, write_table
from benchmarks.gpu.serving_variants import (
    DeviceClock,
    InMemoryStatic,
    RunFigures,
    in_memory_engine,
    run_engine,
    timing_forward,
)
from benchmarks.gpu.sync_audit import counting_syncs
from benchmarks.machine import describe_machine
from benchmarks.workloads import PROMPTS, Arrival, Workload
from core.families import FAMILIES

log = logging.getLogger("stepwise.bench.serving")
SERIAL_BURST_SECONDS = 5.0  # the jobs of a family are as many as a serial burst runs in about this long (3 at least)
Shape = tuple[int, int, int]  # (height, width, frames)


@dataclass(frozen=True)
class FamilyPlan:
    name: str  # serving.json's family name
    family: str  # core.families' name
    shape: Shape  # at real size
    num_steps: int
    max_num_seqs: int
    guidance_scale: float
    negative_prompt: str = ""  # given: classifier-free guidance where the family runs it
    mixed: tuple[Shape, ...] = ()  # the mixed-shape burst's shapes at real size (transformer and video families)
    is_required: bool = True
    seconds: float = 90.0  # about what it takes: an optional family starts only with this much left
    num_jobs: int | None = None  # None: as many as a serial burst runs in about SERIAL_BURST_SECONDS
    tiny_shape: Shape = (64, 64, 1)
    tiny_mixed: tuple[Shape, ...] = ()


NEGATIVE = "blurry, low quality"
WIDE = (768, 1344, 1)
TINY_MIXED = ((64, 64, 1), (64, 96, 1), (96, 64, 1))
# Steps and jobs are cut to fit every must-have in one device call of 10 minutes (each family's `seconds`: an
# estimate for an H100); the denoiser's step time and batching do not depend on the step count.
PLANS = (
    # run2's workload (16 jobs of 20 steps, the same prompts, seeds and Poisson draws): before and after compare
    FamilyPlan("sd15", "sd", (512, 512, 1), 20, 8, 7.5, NEGATIVE, seconds=80, num_jobs=16),
    FamilyPlan("sdxl", "sdxl", (1024, 1024, 1), 12, 8, 7.5, NEGATIVE, seconds=50),
    FamilyPlan(
        "flux", "flux", (1024, 1024, 1), 8, 8, 3.5, mixed=((1024, 1024, 1), WIDE), seconds=100, tiny_mixed=TINY_MIXED
    ),
    # true CFG off (guidance 1, no negative prompt): one row a job, to fit the 20 G transformer in the time
    FamilyPlan("qwenimage", "qwenimage", (1024, 1024, 1), 6, 4, 1.0, mixed=((1024, 1024, 1), WIDE), seconds=125),
    FamilyPlan(
        "wan",
        "wan",
        (480, 832, 33),
        6,
        4,
        5.0,
        NEGATIVE,
        mixed=((480, 832, 33), (832, 480, 17)),
        seconds=165,
        tiny_shape=(64, 64, 5),
        tiny_mixed=((64, 64, 5), (64, 96, 5), (64, 64, 9)),
    ),
    FamilyPlan(
        "zimage", "zimage", (1024, 1024, 1), 8, 8, 0.0, mixed=((1024, 1024, 1), WIDE), is_required=False, seconds=70
    ),
    FamilyPlan(
        "sd3",
        "sd3",
        (1024, 1024, 1),
        10,
        4,
        7.0,
        NEGATIVE,
        mixed=((1024, 1024, 1), WIDE),
        is_required=False,
        seconds=90,
    ),
)
DRY_RUN_FAMILIES = ("sd15", "flux", "wan")


@dataclass(frozen=True)
class Profile:
    scale: str  # "real" or "tiny"
    device: torch.device
    num_steps: int | None  # None: each plan's own
    num_jobs: int | None  # None: sized from the serial job's time


class Budget:
    def __init__(self, seconds: float) -> None:
        self.start, self.seconds = time.perf_counter(), seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)


def job(plan: FamilyPlan, profile: Profile, model: str, index: int, shape: Shape | None = None, steps: int = 0):
    height, width, frames = shape or (plan.shape if profile.scale == "real" else plan.tiny_shape)
    spec = FAMILIES[plan.family]
    video: dict[str, Any] = {"fps": spec.default_fps} if spec.is_video else {}
    return GenerationParams(
        prompt=PROMPTS[index % len(PROMPTS)],
        negative_prompt=plan.negative_prompt,
        seed=1000 + index,
        model=model,
        height=height,
        width=width,
        num_frames=frames,
        num_inference_steps=steps or profile.num_steps or plan.num_steps,
        guidance_scale=plan.guidance_scale,
        sampler=spec.default_sampler,
        **video,
    )


def sized_jobs(plan: FamilyPlan, one_job_seconds: float) -> int:
    return max(3, min(2 * plan.max_num_seqs, round(SERIAL_BURST_SECONDS / one_job_seconds)))


def workload(name: str, params: list[GenerationParams], rate: float | None = None, multiple: float = 1.0) -> Workload:
    """A burst (no rate), or Poisson arrivals at `rate` a second, drawn as `benchmarks.workloads.poisson` draws
    them for the same multiple of serial capacity (so SD 1.5's match the earlier GPU runs')."""
    rng, at, arrivals = random.Random(f"poisson-0-{float(multiple)}"), 0.0, []
    for one in params:
        arrivals.append(Arrival(at, one))
        at += rng.expovariate(rate) if rate else 0.0
    return Workload(name, "poisson" if rate else "burst", name, tuple(arrivals), rate_per_second=rate)


def run_family(plan: FamilyPlan, profile: Profile) -> tuple[dict, dict]:
    """(serving.json's entry for the family, its details)."""
    device, started = profile.device, time.perf_counter()
    built = build_model(plan.name, profile.scale, device)
    model = f"suite/{plan.name}"
    adapter = adapter_class(plan.family)(model, built.pipeline, device, built.dtype)
    details: dict[str, Any] = {"build_seconds": time.perf_counter() - started, "runs": {}}
    runs: dict[str, dict[str, RunFigures]] = {"serial": {}, "default": {}, "static": {}}
    shapes = plan.mixed if profile.scale == "real" else plan.tiny_mixed
    warm_steps = FAMILIES[plan.family].min_steps  # warm-ups run the fewest steps the family's schedule takes

    def jobs(count: int, steps: int = 0, offset: int = 0) -> list[GenerationParams]:
        return [job(plan, profile, model, offset + i, steps=steps) for i in range(count)]

    engine_clock = DeviceClock(device)
    with timing_forward(adapter, engine_clock):
        serial = in_memory_engine(adapter, max_num_seqs=1)
        try:
            run_engine(serial, workload("warm-up", jobs(1, steps=warm_steps)), engine_clock)
            one_job = run_engine(serial, workload("one job", jobs(1, offset=90)), engine_clock).wall_seconds
            num_jobs = profile.num_jobs or plan.num_jobs or sized_jobs(plan, one_job)
            runs["serial"]["burst"] = run_engine(serial, workload("burst", jobs(num_jobs)), engine_clock)
            capacity = num_jobs / runs["serial"]["burst"].wall_seconds
            arrivals = {f"poisson_{m}x": workload(f"poisson_{m}x", jobs(num_jobs), m * capacity, m) for m in (1, 2)}
            for name, arrival in arrivals.items():
                runs["serial"][name] = run_engine(serial, arrival, engine_clock)
        finally:
            serial.shutdown()
        details.update(num_jobs=num_jobs, serial_capacity=capacity, one_job_engine_seconds=one_job)
        default = in_memory_engine(
            adapter, max_num_seqs=plan.max_num_seqs, max_num_tokens=capacity_tokens(plan, profile), phase_timing=True
        )
        try:
            # its curve warmed its forwards (on CUDA); this warms a job's start and decode
            run_engine(default, workload("warm-up", jobs(1, steps=warm_steps)), engine_clock)
            runs["default"]["burst"] = run_engine(default, workload("burst", jobs(num_jobs)), engine_clock)
            runs["default"]["poisson_1x"] = run_engine(default, arrivals["poisson_1x"], engine_clock)
            syncs: Counter = Counter()
            with counting_syncs(syncs, device):
                runs["default"]["poisson_2x"] = run_engine(default, arrivals["poisson_2x"], engine_clock)
            details["syncs_poisson_2x"] = dict(syncs.most_common())
            if shapes:
                try:
                    details["mixed_shapes"] = mixed_shapes(plan, profile, model, shapes, default, engine_clock)
                except Exception as e:  # the serving figures above stand without it
                    log.exception("%s: the mixed-shape burst failed", plan.name)
                    details["mixed_shapes_error"] = f"{type(e).__name__}: {e}"
            details["forward_curve"] = default.stats()["forward_curve"]
        finally:
            default.shutdown()
    static = InMemoryStatic(built.pipeline, plan.family, plan.max_num_seqs, 1 / capacity, DeviceClock(device))
    try:  # diffusers' pipeline decodes a whole group at once: what it cannot run is reported, the engine's stays
        static.measure(workload("warm-up", jobs(1, steps=warm_steps)))
        details["one_job_static_seconds"] = static.measure(workload("one job", jobs(1, offset=90))).wall_seconds
        runs["static"]["burst"] = static.measure(workload("burst", jobs(num_jobs)))
        for name, arrival in arrivals.items():
            runs["static"][name] = static.measure(arrival)
    except Exception as e:
        log.exception("%s: static batching failed", plan.name)
        details["static_error"] = f"{type(e).__name__}: {e}"
    finally:
        static.close()
    details["runs"] = {v: {w: figures.details() for w, figures in by_w.items()} for v, by_w in runs.items()}
    details["seconds"] = time.perf_counter() - started
    height, width, frames = plan.shape if profile.scale == "real" else plan.tiny_shape
    entry: dict[str, Any] = {"height": height, "width": width}
    if FAMILIES[plan.family].is_video:
        entry["num_frames"] = frames
    entry["workloads"] = {w: {v: runs[v][w].summary() for v in VARIANTS if w in runs[v]} for w in WORKLOADS}
    entry["device_busy"] = {w: f.device_seconds / f.wall_seconds for w, f in runs["default"].items()}
    if "mixed_shapes" in details:
        entry["mixed_shapes_vs_alone"] = details["mixed_shapes"]["mixed_vs_alone"]
    return entry, details


def capacity_tokens(plan: FamilyPlan, profile: Profile) -> int:
    """Static batching's capacity as the engine's token budget: `max_num_seqs` jobs of the family's largest shape
    (as `benchmarks.variants.variant_specs` gives it). The engine's own default counts jobs at the model's native
    size, which an in-memory Z-Image pipeline does not state (its pipeline picks 1024 inside its call); the
    measured forward curve still lowers it to its knee."""
    shapes = (plan.shape, *plan.mixed) if profile.scale == "real" else (plan.tiny_shape, *plan.tiny_mixed)
    spec = FAMILIES[plan.family]
    cost = max(spec.sample_cost(h, w, plan.guidance_scale, plan.negative_prompt, f) for h, w, f in shapes)
    return plan.max_num_seqs * cost


def mixed_shapes(
    plan: FamilyPlan, profile: Profile, model: str, shapes: tuple[Shape, ...], engine: Any, clock: DeviceClock
) -> dict:
    """A burst cycling through `shapes` on the default engine, against the same jobs run shape by shape."""
    per_shape = 2
    params = [job(plan, profile, model, 200 + i, shape=shapes[i % len(shapes)]) for i in range(per_shape * len(shapes))]
    mixed = run_engine(engine, workload("mixed", params), clock)
    alone = []
    for shape in shapes:
        of_shape = [p for p in params if (p.height, p.width, p.num_frames) == shape]
        alone.append(run_engine(engine, workload(f"alone {shape}", of_shape), clock).wall_seconds)
    return {
        "shapes": [list(shape) for shape in shapes],
        "jobs_per_shape": per_shape,
        "mixed_seconds": mixed.wall_seconds,
        "alone_seconds": alone,
        "mixed_vs_alone": sum(alone) / mixed.wall_seconds,
        "mixed_rows_per_forward": mixed.extra["rows_per_forward"],
    }


def compile_one_job(profile: Profile) -> dict:
    """SD 1.5 at 512: one job alone through the engine eager, with its denoiser compiled to CUDA graphs
    ("graphs"), and through diffusers' pipeline: each one's seconds per step (the second job, warm)."""
    plan = PLANS[0]
    built = build_model(plan.name, profile.scale, profile.device)
    model = f"suite/{plan.name}"
    adapter = adapter_class(plan.family)(model, built.pipeline, profile.device, built.dtype)
    clock = DeviceClock(profile.device)
    seconds: dict[str, float] = {}
    static = InMemoryStatic(built.pipeline, plan.family, 1, 0.0, clock)
    for index in (0, 1):
        seconds["pipeline"] = static.measure(workload("one", [job(plan, profile, model, index)])).wall_seconds
    static.close()
    for mode in ("off", "graphs"):
        started = time.perf_counter()
        engine = in_memory_engine(adapter, max_num_seqs=1, denoiser_compile=mode)
        try:
            for index in (0, 1):
                seconds[mode] = run_engine(
                    engine, workload("one", [job(plan, profile, model, index)]), clock
                ).wall_seconds
        finally:
            engine.shutdown()
        seconds[f"{mode}_start_seconds"] = time.perf_counter() - started
    steps = profile.num_steps or plan.num_steps
    return {name: value / steps if name in ("pipeline", "off", "graphs") else value for name, value in seconds.items()}


def run(profile: Profile, plans: list[FamilyPlan], out: Path, budget: Budget, with_compile: bool) -> dict:
    device = profile.device
    document: dict[str, Any] = {"machine": describe_machine(str(device), torch.get_num_threads()), "families": {}}
    document["machine"]["cuda_device"] = document["machine"]["cuda_device"] or f"none ({device.type} dry run)"
    details: dict[str, Any] = {"profile": f"{profile.scale} sizes on {device.type}", "families": {}, "skipped": []}
    memory_gib = torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None
    for plan in plans:
        reason = _cannot_start(plan, budget, memory_gib, profile)
        if reason:
            log.warning("skipping %s: %s", plan.name, reason)
            details["skipped"].append(f"{plan.name} ({reason})")
            continue
        log.info("%s: %.0f s left", plan.name, budget.left())
        try:
            entry, details["families"][plan.name] = run_family(plan, profile)
            document["families"][plan.name] = entry
        except Exception as e:  # one family's failure is reported; the others still run
            log.exception("%s failed", plan.name)
            details["families"][plan.name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        _free(device)
        _write(document, details, out, budget)
    if with_compile and budget.left() > 90:
        try:
            details["compile_one_job"] = compile_one_job(profile)
        except Exception as e:
            details["compile_one_job"] = {"error": f"{type(e).__name__}: {e}"}
        _free(device)
    elif with_compile:
        details["skipped"].append("compile_one_job (time budget)")
    _write(document, details, out, budget)
    return document


def _cannot_start(plan: FamilyPlan, budget: Budget, memory_gib: float | None, profile: Profile) -> str | None:
    """Why the family cannot start: too little time left for it (a must-have needs 80% of its estimate), or too
    little device memory."""
    needed = plan.seconds * (0.8 if plan.is_required else 1.0) if profile.scale == "real" else 0.0
    if budget.left() < needed:
        return f"time budget: {budget.left():.0f} s left, it needs about {needed:.0f}"
    if profile.scale == "real" and memory_gib is not None and memory_gib < REAL_MEMORY_GIB[plan.name]:
        return f"needs about {REAL_MEMORY_GIB[plan.name]} GiB, the device has {memory_gib:.0f}"
    return None


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _write(document: dict, details: dict, out: Path, budget: Budget) -> None:
    errors = shape_errors(document)
    assert not errors, errors  # the suite's own bug: a test holds the dry run to the shape
    details["total_seconds"] = budget.seconds - budget.left()
    out.mkdir(parents=True, exist_ok=True)
    (out / "serving.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / "serving_details.json").write_text(json.dumps(details, indent=2, default=str) + "\n")
    write_table(document, details, out / "serving.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "benchmarks/results/gpu/serving"))
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, a few jobs of 2 steps")
    parser.add_argument(
        "--budget-seconds", type=float, default=520.0, help="start a family only if its estimated time is left of this"
    )
    parser.add_argument("--families", default="", help="comma-separated names (default: all, must-haves first)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --dry-run on the CPU")
    names = [name for name in args.families.split(",") if name] or (DRY_RUN_FAMILIES if args.dry_run else ())
    plans = [plan for plan in PLANS if not names or plan.name in names]
    if args.dry_run:
        torch.set_num_threads(1)
        profile = Profile("tiny", torch.device("cpu"), num_steps=2, num_jobs=3)
    else:
        profile = Profile("real", torch.device("cuda"), num_steps=None, num_jobs=None)
    document = run(profile, plans, args.out, Budget(args.budget_seconds), with_compile=not args.dry_run)
    log.info("wrote %s: %s", args.out / "serving.json", ", ".join(document["families"]) or "no family")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
