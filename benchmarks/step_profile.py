"""Where an engine step's time goes, phase by phase, on a burst against Poisson arrivals (issue 42).

    python -m benchmarks.step_profile [--model builtin:tiny] [--jobs 16] [--steps 20] [--out DIR]

One engine per workload with `EngineConfig(phase_timing=True)` (`batching.step_phases`): a burst of `--jobs`
jobs, then the same jobs arriving as a Poisson stream at twice the serial capacity (measured first, with
`max_num_seqs=1`). For each, milliseconds per iteration of every phase (host wall, loop-thread CPU and, on
CUDA, device time), apart for steady iterations and iterations where a job joined or left a forward (churn).
Then a host-read audit of the Poisson run: every call on the loop thread that reads a tensor's values to the
host (`item`, `tolist`, `bool()`, `nonzero`, `torch.equal`, `.cpu()`, tensor-valued indexing), by call site,
per iteration: on CUDA each one that reads a device tensor waits for the device (a sync). On the CPU every
tensor is a host tensor, so the audit lists the sites and the reader judges which hold device tensors on
CUDA. Writes step_profile.json and step_profile.md to `--out`. The GPU suite (`benchmarks.gpu.serving`)
runs the same phase tables at real size; there `torch.cuda.set_sync_debug_mode` counts the real syncs.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from batching import DiffusionEngine, EngineConfig
from batching.step_phases import PHASES
from benchmarks.machine import describe_machine
from benchmarks.workloads import JobShape, Workload, burst, poisson

log = logging.getLogger("stepwise.bench.step_profile")
HOST_READS = {"item", "tolist", "__bool__", "nonzero", "equal", "cpu", "numpy", "__float__", "__int__", "__index__"}


def run_workload(engine: DiffusionEngine, workload: Workload) -> float:
    """Submit the workload's arrivals on their schedule and wait for every result: the wall seconds."""
    start = time.perf_counter()
    futures = []
    for arrival in workload.arrivals:
        delay = start + arrival.at_seconds - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        futures.append(engine.submit(arrival.params))
    for future in futures:
        future.result()
    return time.perf_counter() - start


def phase_profile(config: EngineConfig, workload: Workload, warm_up: Workload) -> dict[str, Any]:
    """A fresh engine with phase timing: the warm-up workload, then `workload`, profiled."""
    engine = DiffusionEngine(EngineConfig(**{**config.__dict__, "phase_timing": True}))
    try:
        run_workload(engine, warm_up)
        engine.phases.reset()  # the warm-up's iterations are not the workload's
        wall = run_workload(engine, workload)
        stats = engine.stats()
    finally:
        engine.shutdown()
    return {
        "workload": workload.description,
        "wall_seconds": wall,
        "images_per_second": workload.num_jobs / wall,
        "rows_per_forward": stats["rows_per_forward"],
        "phases": stats["phases"],
    }


class _HostReads(TorchFunctionMode):
    """Counts host reads of tensor values by call site (the first frame outside torch)."""

    def __init__(self, sites: Counter) -> None:
        super().__init__()
        self.sites = sites

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        is_read = name in HOST_READS or (
            name in ("__getitem__", "__setitem__") and len(args) > 1 and _has_tensor_index(args[1])
        )
        if is_read:
            frame = next(
                (f for f in reversed(traceback.extract_stack()[:-1]) if "/torch/" not in f.filename),
                None,
            )
            where = f"{_short(frame.filename)}:{frame.lineno} {frame.name}" if frame else "?"
            self.sites[(name, where)] += 1
        return func(*args, **(kwargs or {}))


def host_read_audit(config: EngineConfig, workload: Workload, warm_up: Workload) -> dict[str, Any]:
    """The Poisson run again, every loop-thread iteration under `_HostReads`: reads per iteration by site."""
    engine = DiffusionEngine(config)
    sites: Counter = Counter()
    num_iterations = [0]
    step = engine.step
    loop_thread: list[threading.Thread] = []

    def audited_step() -> bool:
        loop_thread[:] = [threading.current_thread()]
        with _HostReads(sites):
            did_work = step()
        num_iterations[0] += did_work
        return did_work

    try:
        run_workload(engine, warm_up)
        engine.step = audited_step  # type: ignore[method-assign]  # the loop thread looks it up every iteration
        run_workload(engine, workload)
    finally:
        engine.shutdown()
    count = max(1, num_iterations[0])
    return {
        "iterations": num_iterations[0],
        "reads_per_iteration": {f"{name} at {where}": round(n / count, 3) for (name, where), n in sites.most_common()},
    }


def _has_tensor_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(item, torch.Tensor) for item in items)


def _short(filename: str) -> str:
    """A library file from its package folder, a project file from the checkout's root."""
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1]
    root = str(Path(__file__).resolve().parents[1]) + "/"
    return filename.removeprefix(root)


def phase_table(profiles: dict[str, dict[str, Any]], clock: str = "host_ms") -> list[str]:
    """A Markdown table: one row per phase, one column per (workload, iteration kind), ms per iteration."""
    columns = [
        (workload, kind)
        for workload, profile in profiles.items()
        for kind in ("steady", "churn")
        if kind in profile["phases"]
    ]
    lines = [
        "| phase | " + " | ".join(f"{workload} {kind}" for workload, kind in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for phase in PHASES:
        cells = [f"{profiles[w]['phases'][k].get(clock, {}).get(phase, 0.0):.3f}" for w, k in columns]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    lines.append(
        "| iteration wall | " + " | ".join(f"{profiles[w]['phases'][k]['wall_ms']:.3f}" for w, k in columns) + " |"
    )
    lines.append("| iterations | " + " | ".join(str(profiles[w]["phases"][k]["iterations"]) for w, k in columns) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/step_profile"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    shape = JobShape(model=args.model, num_steps=args.steps)
    config = EngineConfig(model=args.model, device="cpu", max_num_seqs=args.max_num_seqs, num_threads=1)
    warm_up = burst(shape, args.max_num_seqs)
    serial = EngineConfig(**{**config.__dict__, "max_num_seqs": 1})
    serial_rate = phase_profile(serial, burst(shape, 4), burst(shape, 1))["images_per_second"]
    arrivals = poisson(shape, args.jobs, 2 * serial_rate, 2.0)
    profiles = {
        "burst": phase_profile(config, burst(shape, args.jobs), warm_up),
        "poisson_2x": phase_profile(config, arrivals, warm_up),
    }
    audit = host_read_audit(config, arrivals, warm_up)
    result = {
        "machine": describe_machine("cpu", 1),
        "model": args.model,
        "max_num_seqs": args.max_num_seqs,
        "serial_images_per_second": serial_rate,
        "profiles": profiles,
        "host_reads": audit,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "step_profile.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# Engine step profile: {args.model}, {args.jobs} jobs of {args.steps} steps, "
        f"max_num_seqs {args.max_num_seqs}",
        "",
        f"CPU, one thread; Poisson at {2 * serial_rate:.2f}/s (2x serial). Milliseconds per iteration; steady: the "
        "same samples as the iteration before, churn: a sample joined or left a forward.",
        "",
        "Host wall time on the loop thread:",
        "",
        *phase_table(profiles),
        "",
        "Loop-thread CPU time:",
        "",
        *phase_table(profiles, "cpu_ms"),
        "",
        f"Host reads of tensor values on the loop thread, per iteration ({audit['iterations']} iterations of the "
        "Poisson run):",
        "",
        "| read at | per iteration |",
        "|---|---|",
        *(f"| `{site}` | {count} |" for site, count in audit["reads_per_iteration"].items()),
        "",
    ]
    (args.out / "step_profile.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
