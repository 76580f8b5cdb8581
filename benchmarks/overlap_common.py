"""What the overlap benchmarks (decode_overlap, encode_overlap) share: the jobs' parameters, the common
arguments, and the off/on comparison (each variant in a process of its own, alternating, medians)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Iterable


def job_params(args: argparse.Namespace, prompt: str, index: int, steps: int):
    """The GenerationParams of job `index`: `prompt` with the picture's number, seeded by it, at `args.size`."""
    from batching import GenerationParams

    return GenerationParams(
        prompt=f"{prompt}, picture {index}",
        seed=index,
        model=args.model,
        num_inference_steps=steps,
        height=args.size,
        width=args.size,
    )


def add_engine_arguments(parser: argparse.ArgumentParser, *, size: int, jobs: int) -> None:
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=size)
    parser.add_argument("--jobs", type=int, default=jobs)


def add_comparison_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=2, help="off/on pairs, alternating")


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", help="also write the summary here")
    parser.add_argument("--variant", choices=("on", "off"), help=argparse.SUPPRESS)  # one variant, in this process


def compare(
    module: str,
    args: argparse.Namespace,
    argv: list[str],
    step_counts: list[int],
    figures: Iterable[str],
    *,
    swaps_order: bool = False,
) -> dict:
    """Runs `python -m module ... --variant off|on` `args.repeats` times each, alternating; the runs and medians.
    `swaps_order`: every other pair runs "on" first (off on, on off, ...), so that a variant gains nothing
    from always running first or second."""
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for repeat in range(args.repeats):
        for name in ("on", "off") if swaps_order and repeat % 2 else ("off", "on"):
            completed = subprocess.run(
                [sys.executable, "-m", module, *argv, "--variant", name],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[name].append(json.loads(completed.stdout.strip().splitlines()[-1]))
    summary = {
        "settings": {key: value for key, value in vars(args).items() if key not in ("variant", "json")},
        "step_counts": step_counts,
        "runs": runs,
    }
    summary["median"] = {
        name: {key: sorted(run[key] for run in results)[len(results) // 2] for key in figures}
        for name, results in runs.items()
    }
    return summary


def variant_or_summary(
    args: argparse.Namespace, run_variant: Callable[[argparse.Namespace, bool], dict], compare_all: Callable[[], dict]
) -> dict | None:
    """With --variant: runs that variant here and prints its figures as JSON (None). Else the comparison's
    summary, also written to --json when given."""
    if args.variant:
        print(json.dumps(run_variant(args, args.variant == "on")))
        return None
    summary = compare_all()
    if args.json:
        with open(args.json, "w") as file:
            json.dump(summary, file, indent=2)
    return summary
