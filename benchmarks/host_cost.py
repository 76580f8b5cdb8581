"""The engine's own time per denoise step, outside the model's calls, at 1, 8 and 16 running jobs (issue 42).

    python -m benchmarks.host_cost [--jobs 1 8 16] [--steps 24] [--rounds 3] [--tree PATH ...]

With `builtin:tiny` on the CPU a forward is cheap, so what the engine adds around it shows: scheduling, input
assembly, guidance, sampler steps, bookkeeping. Each engine iteration is timed on the loop thread, and the
time spent inside the adapter's model calls (the denoiser forward, the text encoder, the VAE decode) is
subtracted; only iterations where every job runs and none starts or finishes count (the steady state), the
first two and the last two of those left out. Target (issue 42): under 1 ms + 0.05 ms a job. Then, in a run
of its own, the torch calls the loop thread makes there are counted: on CUDA each one that computes is a
kernel launch, several microseconds of host time, whatever the CPU's speed.

Each `--tree` (a checkout of the project, e.g. a `git worktree` of main; default: this one) runs in its own
process with that tree first on `sys.path`, one thread, rounds alternating between trees; the medians over
rounds are printed, and the ratio to the first tree. The measurement wraps the engine from outside (the
adapter's methods and `DiffusionEngine.step`), so it runs against trees older than this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_BASE_MS = 1.0
TARGET_PER_JOB_MS = 0.05
# torch calls that read a tensor's metadata and launch nothing
NOT_CALLS = {"__get__", "dim", "size", "numel", "stride", "is_contiguous", "data_ptr", "element_size", "__len__"}


def measure(num_jobs: int, num_steps: int, count_calls: bool = False, stub_forward: bool = False) -> dict:
    """In this process: one engine with `num_jobs` jobs running together; per steady iteration, ms outside model
    calls (median) and ms inside them. With `count_calls` (a run of its own: counting slows the loop), the torch
    calls the loop thread makes outside model calls per steady iteration instead: on CUDA each one that computes
    is a kernel launch. With `stub_forward` the denoiser's forward returns zeros at once: the engine alone, its
    time not disturbed by the model's (on a shared machine the model's time, not the engine's, carries the noise)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CallCounter(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if not inside["depth"] and getattr(func, "__name__", "") not in NOT_CALLS:
                inside["calls"] += 1
            return func(*args, **(kwargs or {}))

    from batching import DiffusionEngine, EngineConfig, GenerationParams

    torch.set_num_threads(1)
    engine = DiffusionEngine(
        EngineConfig(model="builtin:tiny", device="cpu", max_num_seqs=num_jobs, max_num_tokens=10**9, num_threads=1)
    )
    model = engine.model_runner.model
    inside = {"seconds": 0.0, "starts": 0, "decodes": 0, "depth": 0, "calls": 0}

    def timed(function, counter: str | None = None):
        def call(*args, **kwargs):
            start = time.perf_counter()
            inside["depth"] += 1
            try:
                return function(*args, **kwargs)
            finally:
                inside["depth"] -= 1
                inside["seconds"] += time.perf_counter() - start
                if counter:
                    inside[counter] += 1

        return call

    if stub_forward:
        model.forward = lambda batch: torch.zeros_like(batch.latents)  # type: ignore[method-assign,arg-type]
    model.forward = timed(model.forward)  # type: ignore[method-assign]  # instance attributes shadow them
    model.encode_prompts = timed(model.encode_prompts, "starts")  # type: ignore[method-assign]
    model.decode = timed(model.decode, "decodes")  # type: ignore[method-assign]
    iterations: list[tuple[float, float, bool]] = []  # (wall s, inside model calls s or calls, steady)
    step = engine.step

    def timed_step() -> bool:
        before = dict(inside)
        is_full = engine.scheduler.num_running == num_jobs
        start = time.perf_counter()
        if count_calls:
            with CallCounter():
                did_work = step()
        else:
            did_work = step()
        wall = time.perf_counter() - start
        is_steady = (
            is_full
            and did_work
            and inside["starts"] == before["starts"]
            and inside["decodes"] == before["decodes"]
            and engine.scheduler.num_running == num_jobs
        )
        spent = inside["calls"] - before["calls"] if count_calls else inside["seconds"] - before["seconds"]
        iterations.append((wall, spent, is_steady))
        return did_work

    def run_jobs(seed: int) -> None:
        futures = [
            engine.submit(
                GenerationParams(
                    prompt=f"a lighthouse at dusk, view {i}",
                    seed=seed + i,
                    num_inference_steps=num_steps,
                    guidance_scale=7.5,
                    model="builtin:tiny",
                )
            )
            for i in range(num_jobs)
        ]
        for future in futures:
            future.result()

    engine.step = timed_step  # type: ignore[method-assign]  # the loop thread looks it up at every iteration
    run_jobs(0)  # warm-up: allocator, first calls
    iterations.clear()
    run_jobs(1000)
    engine.shutdown()
    steady = [(wall, model_seconds) for wall, model_seconds, is_steady in iterations if is_steady][2:-2]
    if count_calls:
        return {"num_jobs": num_jobs, "calls": statistics.median(calls for _, calls in steady)}
    return {
        "num_jobs": num_jobs,
        "num_steady_iterations": len(steady),
        "host_ms": 1000 * statistics.median(wall - model_seconds for wall, model_seconds in steady),
        "model_ms": 1000 * statistics.median(model_seconds for _, model_seconds in steady),
    }


def run_child(tree: Path, num_jobs: int, num_steps: int, count_calls: bool = False, stub: bool = False) -> dict:
    environment = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    # This file is loaded by its path, so the measured tree's packages are the ones imported (first on the path).
    script = (
        "import importlib.util, json, sys; sys.path.insert(0, sys.argv[1]); "
        "spec = importlib.util.spec_from_file_location('host_cost_probe', sys.argv[2]); "
        "probe = importlib.util.module_from_spec(spec); spec.loader.exec_module(probe); "
        "print(json.dumps(probe.measure(int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == 'calls', "
        "sys.argv[6] == 'stub')))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script, str(tree), __file__, str(num_jobs), str(num_steps)]
        + ["calls" if count_calls else "time", "stub" if stub else "model"],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    figures = json.loads(completed.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=Path, action="append", help="a checkout to measure (repeatable)")
    parser.add_argument("--stub-forward", action="store_true", help="the forward returns zeros: the engine alone")
    args = parser.parse_args(argv)
    trees = args.tree or [Path(__file__).resolve().parents[1]]
    results: dict[str, dict[int, list[float]]] = {str(tree): {n: [] for n in args.jobs} for tree in trees}
    for round_index in range(args.rounds):
        for tree in trees:
            for num_jobs in args.jobs:
                figures = run_child(tree, num_jobs, args.steps, stub=args.stub_forward)
                results[str(tree)][num_jobs].append(figures["host_ms"])
                print(
                    f"round {round_index + 1} {tree} jobs={num_jobs}: host {figures['host_ms']:.3f} ms, "
                    f"model {figures['model_ms']:.3f} ms ({figures['num_steady_iterations']} steady iterations)",
                    flush=True,
                )
    calls = {
        str(tree): {n: run_child(tree, n, args.steps, count_calls=True)["calls"] for n in args.jobs} for tree in trees
    }
    first = str(trees[0])
    print("\ntorch calls per step outside model calls (each a kernel launch on CUDA where it computes):")
    for tree in trees:
        print(f"  {tree}: " + "; ".join(f"{n} jobs {calls[str(tree)][n]:.0f}" for n in args.jobs))
    print(f"\nmedian host ms per step outside model calls ({args.rounds} rounds; target 1 ms + 0.05 ms a job):")
    for tree in trees:
        cells = []
        for num_jobs in args.jobs:
            median = statistics.median(results[str(tree)][num_jobs])
            target = TARGET_BASE_MS + TARGET_PER_JOB_MS * num_jobs
            ratio = median / statistics.median(results[first][num_jobs])
            cells.append(f"{num_jobs} jobs {median:.3f} (target {target:.2f}, x{ratio:.2f} of first)")
        print(f"  {tree}: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
