"""The first job after `stepwise up` says ready, against the second: is `ready` warm?

    python -m benchmarks.first_job [--baseline main] [--rounds 2] [--model builtin:shapes]

Each round starts a `stepwise up` of each tree in turn (the baseline's files, then this checkout),
waits until it says ready, then submits one job of the model's defaults, waits for its end, and
submits the same job again (another seed). Prints each job's latency (created -> succeeded) and its
engine's denoise time, and the ratio first / second, with the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from benchmarks.api_submit import source_tree
from benchmarks.e2e import UpStack

TERMINAL = {"succeeded", "failed", "canceled", "expired"}


def run_job(session: requests.Session, url: str, model: str, seed: int) -> dict[str, float]:
    response = session.post(
        f"{url}/v1/jobs", json={"model": model, "prompt": "a red circle on a blue background", "seed": seed}, timeout=60
    )
    response.raise_for_status()
    job_id = response.json()["job_id"]
    while True:
        job = session.get(f"{url}/v1/jobs/{job_id}", timeout=60).json()
        if job["state"] in TERMINAL:
            break
        time.sleep(0.05)
    assert job["state"] == "succeeded", job
    timings = job.get("timings") or {}
    return {"latency": float(timings["total"]), "denoise": float(timings["denoise"])}


def run_tree(tree: Path | None, model: str, num_threads: int) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="stepwise-first-job-") as folder:
        with UpStack(Path(folder), max_num_seqs=8, num_threads=num_threads, device="cpu", tree=tree, model=model) as up:
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {up.key}"
            return [run_job(session, up.url, model, seed) for seed in (1, 2)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="git ref of the baseline tree (default: main)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="builtin:shapes")
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    args = parser.parse_args()
    results: dict[str, list[Any]] = {}
    loads = []
    with source_tree(args.baseline) as baseline:
        trees = {f"baseline {args.baseline}": baseline, "this tree": None}
        for round_index in range(args.rounds):
            for name, tree in trees.items():
                first, second = run_tree(tree, args.model, args.num_threads)
                loads.append(os.getloadavg()[0])
                results.setdefault(name, []).append({"first": first, "second": second})
                print(
                    f"round {round_index + 1} {name:<16} "
                    f"first {first['latency']:6.2f}s (denoise {first['denoise']:5.2f})"
                    f"  second {second['latency']:6.2f}s (denoise {second['denoise']:5.2f})"
                    f"  ratio {first['latency'] / second['latency']:5.1f}x  load {loads[-1]:.1f}",
                    flush=True,
                )
    summary = {
        name: statistics.median(run["first"]["latency"] / run["second"]["latency"] for run in runs)
        for name, runs in results.items()
    }
    print("median first/second latency: " + ", ".join(f"{name} {ratio:.1f}x" for name, ratio in summary.items()))
    if args.out:
        document = {"model": args.model, "load_averages": loads, "ratio_first_to_second": summary, "runs": results}
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
