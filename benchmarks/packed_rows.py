"""Rows of different sizes packed into one forward, on the CPU: what a mixed-size burst keeps of a uniform burst's
pixels a second.

    nice -n 10 python -m benchmarks.packed_rows [--models builtin:tiny-flux ...] [--rounds 3] [--steps 8]
        [--pairs 3] [--out DIR]

Per model, each round runs the engine in a process of its own (one torch thread): it loads the model, warms
up, then times `--pairs` uniform bursts (8 jobs at 96x96) and mixed-size bursts (64x64, 128x128, 64x128 and
128x64, twice each: the same pixels, the same jobs) back to back, in alternating order, and then the
denoiser forward alone over each burst's batch of all 8 jobs. Wan's jobs are 5-frame videos. One engine
group holds every job (max_num_seqs 8, max_num_groups 1, a token budget that admits them all), so every
forward of the mixed burst mixes sizes. Prints and writes, per model, the median mixed / uniform ratio of
pixels a second (the target: >= 0.95) on CPU time and on wall time, of the forward's time, and the share of
computed sequence positions that were padding (engine.stats()'s tokens_padded / tokens_computed: 0).

Until commit 19cf128 the engine could still pad rows to the longest instead (an option kept only for this
measurement); its figures against packing are in benchmarks/results/packed_rows/ (docs/benchmarks.md,
"Mixed sizes: packed rows").
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODELS = [
    "builtin:tiny-flux",
    "builtin:tiny-flux2",
    "builtin:tiny-sd3",
    "builtin:tiny-zimage",
    "builtin:tiny-qwen-image",
    "builtin:tiny-wan",
]
UNIFORM = [(96, 96)] * 8
MIXED = [(64, 64), (128, 128), (64, 128), (128, 64)] * 2  # the uniform burst's pixels, in the same number of jobs
VIDEO_FRAMES = 5


def burst_params(model: str, sizes: list[tuple[int, int]], steps: int, seed: int):
    from batching import GenerationParams

    frames = VIDEO_FRAMES if "wan" in model else 1
    return [
        GenerationParams(
            prompt=f"a red fox in the snow, picture {index}",
            model=model,
            seed=seed + index,
            num_inference_steps=steps,
            height=height,
            width=width,
            num_frames=frames,
        )
        for index, (height, width) in enumerate(sizes)
    ]


def run_burst(engine, params_list) -> dict:
    before = engine.stats()
    started, cpu_started = time.perf_counter(), time.process_time()
    futures = [engine.submit(params) for params in params_list]
    for future in futures:
        future.result(timeout=600)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    after = engine.stats()
    pixels = sum(p.height * p.width * p.num_frames for p in params_list)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "pixels_per_second": pixels / seconds,
        "pixels_per_cpu_second": pixels / cpu_seconds,
        "tokens_computed": after["tokens_computed"] - before["tokens_computed"],
        "tokens_padded": after["tokens_padded"] - before["tokens_padded"],
        "sizes_per_forward": {
            size: count - before["sizes_per_forward"].get(size, 0) for size, count in after["sizes_per_forward"].items()
        },
    }


def run_engine(model: str, steps: int, pairs: int, mixed_first: bool) -> dict:
    """In this process: a warm-up, then `pairs` uniform and mixed bursts, alternating which goes first; then the
    denoiser forward alone over each burst's batch of all 8 jobs, alternating (`forward_milliseconds`)."""
    from batching import DiffusionEngine, EngineConfig

    config = EngineConfig(
        model=model, device="cpu", max_num_seqs=8, max_num_groups=1, max_num_tokens=10**7, num_threads=1
    )
    bursts: dict[str, list[dict]] = {"uniform": [], "mixed": []}
    with DiffusionEngine(config) as engine:
        for sizes in (UNIFORM[:4], MIXED[:4]):  # warm-up: both shapes of forward, a few steps
            run_burst(engine, burst_params(model, sizes, 2, seed=1000))
        adapter: Any = engine.model_runner.model  # its forward is wrapped to keep a copy of each burst's batch
        forward = adapter.forward
        batches: dict[str, Any] = {}
        for pair in range(pairs):
            order = [("mixed", MIXED), ("uniform", UNIFORM)]
            for name, sizes in order if (pair % 2 == 0) == mixed_first else order[::-1]:
                adapter.forward = _capturing(forward, batches, name)
                bursts[name].append(run_burst(engine, burst_params(model, sizes, steps, seed=1 + 10 * pair)))
        adapter.forward = forward
        return {**bursts, "forward_milliseconds": _forward_milliseconds(forward, batches)}


def _capturing(forward, batches: dict, name: str):
    """`forward`, keeping a copy of the first batch that holds all 8 jobs of burst `name`."""

    def capture(batch):
        if name not in batches and len(batch.membership) == len(UNIFORM):
            batches[name] = copy.deepcopy(batch)
        return forward(batch)

    return capture


def _forward_milliseconds(forward, batches: dict, repeats: int = 5, calls: int = 3) -> dict:
    """CPU milliseconds of one forward over each captured batch: the median of `repeats`, alternating batches."""
    import torch

    times: dict[str, list[float]] = {name: [] for name in batches}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, batch in batches.items():
                forward(copy.copy(batch))  # untimed: the adapter builds this batch's layout (kept while it runs)
                started = time.process_time()
                for _ in range(calls):
                    forward(copy.copy(batch))  # a fresh batch: its forward counts positions into it
                times[name].append((time.process_time() - started) / calls * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def compare(models: list[str], rounds: int, steps: int, pairs: int) -> dict:
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    runs: dict[str, list[dict]] = {model: [] for model in models}
    for round_index in range(rounds):
        for model in models:
            argv = ["--one", model, "--steps", str(steps), "--pairs", str(pairs)]
            if round_index % 2:
                argv.append("--mixed-first")
            completed = subprocess.run(
                [sys.executable, "-m", "benchmarks.packed_rows", *argv], capture_output=True, text=True, check=True
            )
            result = json.loads(completed.stdout.strip().splitlines()[-1])
            runs[model].append(result)
            ratios = [
                (
                    m["pixels_per_cpu_second"] / u["pixels_per_cpu_second"],
                    m["pixels_per_second"] / u["pixels_per_second"],
                )
                for m, u in zip(result["mixed"], result["uniform"])
            ]
            print(
                f"round {round_index + 1} {model:<26} mixed / uniform (cpu, wall) "
                + " ".join(f"{cpu:.2f},{wall:.2f}" for cpu, wall in ratios),
                flush=True,
            )
    return {"runs": runs, "summary": summarise(runs), "load_average_end": os.getloadavg()}


def summarise(runs: dict[str, list[dict]]) -> dict:
    """Per model: the median pixels a second of each burst, and the median of the mixed / uniform ratios of bursts
    run back to back (closer in time than any two medians, so the machine's load swings them less)."""
    summary = {}
    for model, results in runs.items():
        pairs = [(m, u) for run in results for m, u in zip(run["mixed"], run["uniform"])]
        summary[model] = {
            "uniform_pixels_per_second": statistics.median(u["pixels_per_second"] for _, u in pairs),
            "mixed_pixels_per_second": statistics.median(m["pixels_per_second"] for m, _ in pairs),
            "mixed_over_uniform": statistics.median(m["pixels_per_second"] / u["pixels_per_second"] for m, u in pairs),
            "mixed_over_uniform_cpu": statistics.median(
                m["pixels_per_cpu_second"] / u["pixels_per_cpu_second"] for m, u in pairs
            ),
            "forward_mixed_over_uniform_cpu": statistics.median(
                run["forward_milliseconds"]["mixed"] / run["forward_milliseconds"]["uniform"] for run in results
            ),
            "padded_share_of_positions_mixed": sum(m["tokens_padded"] for m, _ in pairs)
            / max(1, sum(m["tokens_computed"] for m, _ in pairs)),
            "num_pairs": len(pairs),
        }
    return summary


def markdown(result: dict, args: argparse.Namespace) -> str:
    lines = [
        "# Mixed-size bursts of packed rows (CPU)",
        "",
        f"`nice -n 10 python -m benchmarks.packed_rows --rounds {args.rounds} --steps {args.steps} --pairs "
        f"{args.pairs}`; {platform.machine()}, torch with 1 thread, each round in a process of its own, bursts in "
        "alternating order; the machine was shared with other engineers' tests (load average "
        f"{result['load_average_end'][2]:.1f} over the last 15 minutes of the run, on 2 cores).",
        "",
        f"Bursts of 8 jobs, {args.steps} steps: uniform 96x96; mixed 64x64, 128x128, 64x128 and 128x64 twice (the "
        "same pixels, and the same image tokens but for Z-Image's rounding of each row to 32; Wan: "
        f"{VIDEO_FRAMES}-frame videos). Mixed / uniform: the median ratio of pixels a second of bursts run back to "
        "back, on CPU time (the process's, all its threads) and on wall time: on a machine whose load runs above "
        "its cores, wall time measures the neighbours as much as the code. The forward column: the time of the "
        "denoiser alone over the mixed burst's 8 jobs over its time over the uniform burst's (CPU time).",
        "",
        "| model | mixed / uniform, CPU time | wall time | forward time, mixed / uniform | padding among positions |",
        "|---|---|---|---|---|",
    ]
    for model, figures in result["summary"].items():
        lines.append(
            f"| {model} | {figures['mixed_over_uniform_cpu']:.2f}x | {figures['mixed_over_uniform']:.2f}x | "
            f"{figures['forward_mixed_over_uniform_cpu']:.2f} | {figures['padded_share_of_positions_mixed']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=3, help="uniform and mixed bursts per process, alternating")
    parser.add_argument("--out", help="a folder for summary.json and results.md")
    parser.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--mixed-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_engine(args.one, args.steps, args.pairs, args.mixed_first)))
        return
    result = compare(args.models, args.rounds, args.steps, args.pairs)
    text = markdown(result, args)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        (out / "results.md").write_text(text)


if __name__ == "__main__":
    main()
