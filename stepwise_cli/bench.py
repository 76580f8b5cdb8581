"""`stepwise bench`: what step-level batching buys, side by side (see docs/benchmarks.md).

stepwise bench                      # the full suite (10-15 minutes on 2 CPU cores)
stepwise bench --quick              # a few minutes
stepwise bench --models builtin:tiny --no-e2e --out /tmp/bench
stepwise bench --model builtin:tiny-flux --workloads burst --no-e2e --out /tmp/bench-flux
stepwise bench --model builtin:tiny-wan       # a video model: videos/s side by side, and images beside a backfill
stepwise bench --out benchmarks/results    # replace the committed results (on purpose only)
stepwise bench --submit                # submit throughput only: BASELINE_REF's API and this tree's
stepwise bench --suite gpu            # the prepared GPU run (benchmarks/gpu: real-size models, one CUDA device)
stepwise bench --suite gpu --dry-run --out /tmp/gpu   # the same at tiny sizes on the CPU (what make test runs)
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from benchmarks.run import SIZES, SuiteOptions
from core.builtin_models import builtin_names

DEFAULT_OUT = Path("var/bench")  # not benchmarks/results: a trial run must not overwrite the committed run
SUITES = ("cpu", "gpu")  # cpu: benchmarks.run (built-in models, any device); gpu: benchmarks.gpu.suite
# The last commit before per-model queues and the one-round-trip submit path: "today's path" of issue 14.
BASELINE_REF = "9e3133e"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--suite",
        choices=SUITES,
        default="cpu",
        help="cpu: the built-in models' suite below (default); gpu: the prepared GPU run of benchmarks/gpu "
        "(real-size random-weight models on CUDA; writes gpu_results.json and gpu_summary.md; takes --out, "
        "--dry-run and --budget-seconds only)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="with --suite gpu: tiny sizes, one repetition, on the CPU"
    )
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=None,
        help="with --suite gpu: start no section after this many seconds (default: the suite's, 420)",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        action="store_const",
        dest="size",
        const="quick",
        help="fewer and shorter jobs: a few minutes on 2 cores",
    )
    size.add_argument("--smoke", action="store_const", dest="size", const="smoke", help=argparse.SUPPRESS)
    parser.set_defaults(size="full")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"results folder (default: {DEFAULT_OUT}; with --suite gpu: $OUT, else benchmarks/results/gpu)",
    )
    parser.add_argument(
        "--models",
        "--model",
        nargs="+",
        default=["builtin:tiny", "builtin:small"],
        choices=builtin_names(),
        metavar="MODEL",
        help=f"built-in models to run, any of {', '.join(builtin_names())} (default: builtin:tiny builtin:small)",
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=[],
        metavar="NAME",
        help="only these workloads: burst, poisson (every rate), poisson_1x, mixed_steps, "
        "two_resolution, mixed_guidance (default: all)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads for every variant and the e2e worker (default 1: on a shared "
        "machine more threads than free cores oversubscribe)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default cpu)")
    parser.add_argument(
        "--submit",
        action="store_true",
        help="only measure submit throughput (POST /v1/jobs and /batch, no worker), this tree's API "
        "against --baseline's, alternating in one run",
    )
    parser.add_argument("--baseline", default=BASELINE_REF, help="git ref of the baseline API (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="with --submit: alternating rounds (default 3)")
    parser.add_argument("--seconds", type=float, default=8.0, help="with --submit: seconds per measured run")
    parser.add_argument(
        "--no-e2e",
        dest="e2e",
        action="store_false",
        help="skip the end-to-end runs through `stepwise up` (they need redis-server)",
    )


def results_folder(out: Path | None) -> Path:
    """Where the CPU suite and --submit write: --out, else DEFAULT_OUT (never the committed results unasked)."""
    return out or DEFAULT_OUT


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.suite == "gpu":
        return run_gpu(args)
    if args.dry_run or args.budget_seconds is not None:
        raise SystemExit("stepwise bench: --dry-run and --budget-seconds belong to --suite gpu")
    args.out = results_folder(args.out)
    if args.threads < 1:
        raise SystemExit("stepwise bench: --threads must be at least 1")
    if args.submit:
        return run_submit(args)
    models = tuple(dict.fromkeys(args.models))
    video_models = tuple(model for model in models if is_video_model(model))
    for model in video_models:
        run_video(args, model)
    if video_models and len(video_models) == len(models):
        return 0
    options = SuiteOptions(
        out=args.out,
        size=SIZES[args.size],
        models=tuple(model for model in models if model not in video_models),
        device=args.device,
        num_threads=args.threads,
        run_e2e=args.e2e,
        workloads=tuple(args.workloads),
        command=" ".join(["stepwise", *map(shlex.quote, sys.argv[1:])]),
    )
    from benchmarks.run import run_suite

    summary = run_suite(options)
    print(f"results: {args.out / 'results.md'}")
    shapes = summary["correctness"]
    print(
        f"  {shapes['model']} drawn as asked (pixel checker): alone {_pct(shapes['alone']['accuracy'])}, "
        f"co-batched {_pct(shapes['co_batched']['accuracy'])} of {shapes['num_cases']}"
    )
    for model, ratios in summary["headlines"].items():
        if model == "e2e":
            print(f"  end to end: {ratios}")
            continue
        print(
            f"  {model}: default/serial {_x(ratios['throughput_default_over_serial_burst'])}, "
            f"default/static {_x(ratios['throughput_default_over_static_burst'])}, "
            f"default/fifo two-resolution {_x(ratios['throughput_default_over_fifo_two_resolution'])}, "
            f"engine efficiency {_pct(ratios['engine_efficiency_default_burst'])}"
        )
    return 0


def is_video_model(model: str) -> bool:
    from core.families import FAMILIES, family_of_model

    family = family_of_model(model)
    return family is not None and FAMILIES[family].is_video


def run_video(args: argparse.Namespace, model: str) -> None:
    """benchmarks.video for a video model: its own workloads (videos per second), sized by --quick."""
    from benchmarks import video

    num_jobs, num_steps = (4, 4) if args.size in ("quick", "smoke") else (16, 20)
    options = video.Options(model, num_jobs, num_steps, max_num_seqs=8, num_threads=args.threads, image_gap=0.25)
    command = " ".join(["stepwise", *map(shlex.quote, sys.argv[1:])])
    video.report(
        options, args.out / f"video-{model.removeprefix('builtin:')}", command, rounds=1 if num_jobs < 8 else 3
    )


def run_gpu(args: argparse.Namespace) -> int:
    """The GPU suite (benchmarks/gpu/run.sh calls this after installing the wheels a bare machine lacks)."""
    from benchmarks.gpu import suite

    argv = ["--dry-run"] if args.dry_run else []
    if args.out is not None:
        argv += ["--out", str(args.out)]
    if args.budget_seconds is not None:
        argv += ["--budget-seconds", str(args.budget_seconds)]
    return suite.main(argv)


def run_submit(args: argparse.Namespace) -> int:
    import json

    from benchmarks.api_submit import compare, print_comparison

    summary = compare(args.baseline, num_threads=4, num_clients=8, seconds=args.seconds, batch=100, rounds=args.rounds)
    summary["command"] = " ".join(["stepwise", *map(shlex.quote, sys.argv[1:])])
    print_comparison(summary)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "submit.json").write_text(json.dumps(summary, indent=2))
    print(f"results: {args.out / 'submit.json'}")
    return 0


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"
