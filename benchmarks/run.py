"""The benchmark suite: every variant on every workload, per model; then end to end; then the report.

Per model, the serial burst runs first: its throughput is the serial capacity, which
sets the Poisson rates (multiples of it) and static batching's launch timeout (one
serial job time). Each workload then runs on every variant in turn (serial, static,
fifo, default), so slow drifts in the machine's load fall on all variants alike. Right
after each engine run, the bare UNet is timed at every (size, rows) shape that run used,
for engine efficiency (see component_times).

Output under `out/`: `runs/<model>__<workload>__<variant>.json` (one per run, with the
machine and the load average), `runs/e2e__*.json`, `summary.json`, `results.md` and the
PNG plots.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import workloads
from benchmarks.machine import LoadSampler, describe_machine
from benchmarks.metrics import headline_ratios, summarize
from benchmarks.variants import EngineVariant, RunRecord, StaticBatchVariant, variant_specs
from core.families import FAMILIES

log = logging.getLogger("benchmarks")
RUN_SCHEMA = "stepwise-bench-run/1"
SUMMARY_SCHEMA = "stepwise-bench-summary/1"


@dataclass(frozen=True)
class SuiteSize:
    name: str  # "smoke", "quick", "full"
    num_jobs: dict[str, int]  # model -> jobs per workload
    num_steps: int
    max_num_seqs: int  # engine capacity and static group size
    forward_repeats: int  # timed repeats per shape in the bare-UNet timing
    e2e_num_jobs: int
    size: int = 128
    second_size: int = 192
    rate_multiples: tuple[float, ...] = (0.5, 1.0, 2.0)  # Poisson rates, as multiples of the measured serial capacity
    num_shapes_cases: int = 24  # builtin:shapes cases the pixel checker judges, alone and co-batched


QUICK = SuiteSize(
    "quick", {"builtin:tiny": 8, "builtin:small": 6}, num_steps=10, max_num_seqs=4, forward_repeats=2, e2e_num_jobs=8
)
SIZES = {
    "smoke": SuiteSize(
        "smoke",
        {"builtin:tiny": 3, "builtin:small": 3},
        num_steps=2,
        size=64,
        second_size=96,
        rate_multiples=(1.0, 3.0),
        max_num_seqs=2,
        forward_repeats=1,
        e2e_num_jobs=3,
        num_shapes_cases=3,
    ),
    "quick": QUICK,
    # full: about 10-15 minutes on 2 shared cores; the Poisson runs at 0.5x take longest (their length is set by
    # the arrival schedule), and builtin:small gets fewer jobs because each costs about 3x more.
    "full": dataclasses.replace(
        QUICK,
        name="full",
        num_jobs={"builtin:tiny": 16, "builtin:small": 10},
        num_steps=20,
        max_num_seqs=8,
        forward_repeats=3,
        e2e_num_jobs=16,
    ),
}


@dataclass(frozen=True)
class SuiteOptions:
    out: Path
    size: SuiteSize
    models: tuple[str, ...] = ("builtin:tiny", "builtin:small")
    device: str = "cpu"
    num_threads: int = 1
    run_e2e: bool = True
    workloads: tuple[str, ...] = ()  # names to run ("burst", "two_resolution", ...; "poisson": every rate); () = all
    command: str = "stepwise bench"  # as typed, for the report


def run_suite(options: SuiteOptions) -> dict:
    from benchmarks import correctness, e2e, report

    runs_dir = options.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    for stale in runs_dir.glob("*.json"):
        stale.unlink()
    machine = describe_machine(options.device, options.num_threads)
    started = time.monotonic()
    with LoadSampler() as load:
        models = [run_model(model, options, machine, runs_dir) for model in options.models]
        shapes = correctness.run_correctness(
            options.size.num_shapes_cases, options.size.max_num_seqs, options.device, options.num_threads
        )
        end_to_end = None
        if options.run_e2e:
            tiny = next((m for m in models if m["model"] == "builtin:tiny"), models[0] if models else None)
            end_to_end = e2e.run_e2e(
                options,
                machine,
                runs_dir,
                serial_capacity=tiny["serial_capacity"] if tiny else None,
                engine_burst=_run_of(tiny, "burst", "default") if tiny else None,
            )
    summary = {
        "schema": SUMMARY_SCHEMA,
        "suite": dataclasses.asdict(options.size),
        "command": options.command,
        "git_commit": _git_commit(),
        "command_options": {
            "models": list(options.models),
            "workloads": list(options.workloads),
            "device": options.device,
            "num_threads": options.num_threads,
            "e2e": options.run_e2e,
        },
        "machine": machine,
        "load_average": load.summary(),
        "suite_seconds": time.monotonic() - started,
        "models": models,
        "correctness": shapes,
        "e2e": end_to_end,
        "headlines": headline_ratios(models, end_to_end),
    }
    (options.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (options.out / "results.md").write_text(report.markdown(summary))
    report.plots(summary, options.out)
    return summary


def run_model(model: str, options: SuiteOptions, machine: dict, runs_dir: Path) -> dict:
    size = options.size
    num_jobs = size.num_jobs.get(model, size.num_jobs["builtin:tiny"])  # the family built-ins are tiny-sized
    shape = workloads.JobShape(model=model, num_steps=size.num_steps, size=size.size, second_size=size.second_size)
    sizes = [(shape.size, shape.size), (shape.second_size, shape.second_size), (shape.size, shape.second_size)]
    family = FAMILIES[shape.family]
    max_num_tokens = size.max_num_seqs * max(family.sample_cost(h, w, shape.guidance_scale) for h, w in sizes)
    specs = {spec.name: spec for spec in variant_specs(size.max_num_seqs, max_num_tokens)}
    short = model.removeprefix("builtin:")

    repeats = size.forward_repeats
    serial = EngineVariant(specs["serial"], model, options.device, options.num_threads, repeats)
    serial.open(sizes)
    burst = workloads.burst(shape, num_jobs)
    serial_burst = serial.run(burst)
    serial_capacity = num_jobs / serial_burst.wall_seconds
    static_timeout = 1.0 / serial_capacity
    log.info(
        "%s: serial capacity %.2f images/s; static batching launch timeout %.2fs",
        short,
        serial_capacity,
        static_timeout,
    )
    variants: dict[str, EngineVariant | StaticBatchVariant] = {
        "serial": serial,
        "static": StaticBatchVariant(specs["static"], model, options.device, options.num_threads, static_timeout),
        "fifo": EngineVariant(specs["fifo"], model, options.device, options.num_threads, repeats),
        "default": EngineVariant(specs["default"], model, options.device, options.num_threads, repeats),
    }
    for name in ("static", "fifo", "default"):
        variants[name].open(sizes)

    suite = [burst]
    suite += [
        workloads.poisson(shape, num_jobs, multiple * serial_capacity, multiple) for multiple in size.rate_multiples
    ]
    suite += [
        workloads.mixed_steps(shape, num_jobs),
        workloads.two_resolution(shape, num_jobs),
        workloads.mixed_guidance(shape, num_jobs),
    ]
    mixed = workloads.mixed_size(shape, num_jobs)
    suite += [mixed, workloads.mixed_size_uniform(shape, mixed)]
    if options.workloads:
        wanted = set(options.workloads)
        suite = [w for w in suite if w.name in wanted or (w.kind == "poisson" and "poisson" in wanted)]
    records: list[RunRecord] = [serial_burst]
    for workload in suite:
        for name, variant in variants.items():
            if workload is burst and name == "serial":
                continue
            record = variant.run(workload)
            records.append(record)
            log.info(
                "%s %-14s %-8s %5.2f images/s  p50 %6.2fs  load %.1f",
                short,
                workload.name,
                name,
                workload.num_jobs / record.wall_seconds,
                sorted(j.finished - j.submitted for j in record.jobs)[len(record.jobs) // 2],
                record.load_average_end[0],
            )
    for variant in variants.values():
        variant.close()

    config = {
        "model": model,
        "device": options.device,
        "num_threads": options.num_threads,
        "max_num_seqs": size.max_num_seqs,
        "max_num_tokens": max_num_tokens,
        "serial_capacity_images_per_second": serial_capacity,
        "static_timeout_seconds": static_timeout,
    }
    runs = []
    for record in records:
        metrics = summarize(record)
        path = runs_dir / f"{short}__{record.workload.name}__{record.variant.name}.json"
        path.write_text(json.dumps(_run_document(record, metrics, config, machine), indent=2) + "\n")
        runs.append(
            {
                "workload": record.workload.name,
                "variant": record.variant.name,
                "file": f"runs/{path.name}",
                "metrics": metrics,
                "latencies": sorted(j.finished - j.submitted for j in record.jobs),
            }
        )
    return {
        "model": model,
        "serial_capacity": serial_capacity,
        "static_timeout_seconds": static_timeout,
        "workloads": [_workload_summary(w) for w in suite],
        "runs": runs,
    }


def _run_document(record: RunRecord, metrics: dict, config: dict, machine: dict) -> dict:
    document = {
        "schema": RUN_SCHEMA,
        "kind": "engine_level",
        "model": config["model"],
        "variant": dataclasses.asdict(record.variant),
        "workload": {
            **_workload_summary(record.workload),
            "arrivals": [{"at_seconds": a.at_seconds, "params": a.params.to_dict()} for a in record.workload.arrivals],
        },
        "config": config,
        "machine": machine,
        "load_average": {"start": record.load_average_start, "end": record.load_average_end},
        "metrics": metrics,
        "jobs": [dataclasses.asdict(job) for job in record.jobs],
    }
    if record.variant.kind == "engine":
        document["engine"] = {
            "stats_delta": record.engine_stats,
            "trace": record.trace,
            "bare_forward_seconds": [
                {"height": h, "width": w, "rows": r, "seconds": seconds}
                for (h, w, r), seconds in sorted(record.forward_times.items())
            ],
        }
    else:
        document["static"] = {"unet_rows_per_call": record.static_forwards, "requests_per_group": record.static_groups}
    return document


def _workload_summary(workload: workloads.Workload) -> dict:
    return {
        "name": workload.name,
        "kind": workload.kind,
        "description": workload.description,
        "num_jobs": workload.num_jobs,
        "total_tokens": workloads.total_tokens(workload),
        "rate_per_second": workload.rate_per_second,
        "rate_multiple": workload.rate_multiple,
    }


def _git_commit() -> str | None:
    """HEAD of the checkout the suite ran from, '+dirty' when it had uncommitted changes."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty.strip() else "")


def _run_of(model_result: dict, workload: str, variant: str) -> dict | None:
    return next((r for r in model_result["runs"] if r["workload"] == workload and r["variant"] == variant), None)
