"""The service path's own cost, end to end through `stepwise up`: a baseline commit against this tree.

    python -m benchmarks.service_overhead [--baseline REF] [--rounds 2] [--jobs 16] [--steps 10]

Each round runs both trees in turn (baseline first, then this checkout), each in its own
`stepwise up` (API, Redis, Celery worker with builtin:tiny at `--max-num-seqs` 8, one torch
thread): a warm-up job, a burst of `--jobs` jobs submitted at once, then `--jobs` Poisson
arrivals at one serial job's rate (the baseline's first warm-up sets it, for both). Per
job, overhead = latency - engine time (its own stamps), and its parts from the record
(`benchmarks.e2e.PARTS`; only trees whose worker stamps them). Prints the p50 of each per
tree and workload, pooled over rounds, with the load average beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import requests

from benchmarks import workloads
from benchmarks.api_submit import source_tree
from benchmarks.e2e import PARTS, UpStack, _run_workload

ROOT = Path(__file__).resolve().parent.parent


def run_tree(
    tree: Path | None, shape: workloads.JobShape, num_jobs: int, max_num_seqs: int, rate: float | None
) -> tuple[dict, float]:
    """(workload name -> jobs, serial rate from the warm-up) for one `stepwise up` of `tree`."""
    with tempfile.TemporaryDirectory(prefix="stepwise-overhead-") as folder:
        with UpStack(Path(folder), max_num_seqs=max_num_seqs, num_threads=1, device="cpu", tree=tree) as stack:
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {stack.key}"
            _run_workload(session, stack.url, workloads.burst(shape, 1))  # model warm-up, not recorded
            warm = _run_workload(session, stack.url, workloads.burst(shape, 1))[0]
            rate = rate or 1.0 / warm["latency"]
            runs = {
                "burst": _run_workload(session, stack.url, workloads.burst(shape, num_jobs)),
                "poisson": _run_workload(session, stack.url, workloads.poisson(shape, num_jobs, rate, 1.0)),
            }
    return runs, rate


def p50(values: list[float]) -> float:
    return statistics.median(values) * 1000


def report(name: str, jobs: list[dict]) -> dict:
    ok = [job for job in jobs if job["state"] == "succeeded"]
    row: dict[str, Any] = {
        "jobs": len(jobs),
        "succeeded": len(ok),
        "latency_ms": p50([job["latency"] for job in ok]),
        "overhead_ms": p50([job["overhead"] for job in ok]),
        "worker_overhead_ms": p50([job["overhead"] - job["broker_wait"] for job in ok]),
    }
    with_parts = [job["parts"] for job in ok if job.get("parts")]
    if with_parts:
        row["parts_p50_ms"] = {part: p50([parts[part] for parts in with_parts]) for part in PARTS}
    parts = row.get("parts_p50_ms", {})
    print(
        f"  {name:<28} latency {row['latency_ms']:7.1f}  overhead {row['overhead_ms']:6.1f}  worker "
        f"{row['worker_overhead_ms']:6.1f}  " + "  ".join(f"{part} {ms:5.1f}" for part, ms in parts.items())
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="git ref of the baseline tree (default: main)")
    parser.add_argument("--against", default=None, help="git ref to measure instead of this checkout's files")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="write the jobs and the summary here (JSON)")
    args = parser.parse_args()
    shape = workloads.JobShape(model="builtin:tiny", num_steps=args.steps, size=128, second_size=192)
    pooled: dict[str, dict[str, list[dict]]] = {}
    loads = []
    rate = None
    with contextlib.ExitStack() as stack:
        baseline = stack.enter_context(source_tree(args.baseline))
        against = stack.enter_context(source_tree(args.against)) if args.against else None
        trees = {f"baseline {args.baseline}": baseline, args.against or "this tree": against}
        for round_index in range(args.rounds):
            for name, tree in trees.items():
                runs, rate = run_tree(tree, shape, args.jobs, args.max_num_seqs, rate)
                loads.append(os.getloadavg()[0])
                for workload, jobs in runs.items():
                    pooled.setdefault(name, {}).setdefault(workload, []).extend(jobs)
            print(f"round {round_index + 1} done, load {loads[-1]:.1f}", flush=True)
    print(
        f"p50 ms over {args.rounds} rounds ({args.jobs} jobs each; Poisson at {rate:.2f}/s); "
        f"load average {min(loads):.1f}-{max(loads):.1f}"
    )
    summary: dict[str, Any] = {"rate_per_second": rate, "load_averages": loads, "trees": {}}
    for name, runs in pooled.items():
        for workload, jobs in runs.items():
            summary["trees"].setdefault(name, {})[workload] = report(f"{name}, {workload}", jobs)
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "jobs": pooled}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
