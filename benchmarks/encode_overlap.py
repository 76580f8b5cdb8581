"""Prompt encoding beside the loop vs inline, on this machine: how long running jobs stall, and images/s.

    python -m benchmarks.encode_overlap [--model builtin:tiny] [--size 64] [--jobs 16] [--interval 0.15]
                                        [--encode-repeats 20] [--repeats 2] [--threads 1] [--json FILE]

A steady stream of new jobs (one every `--interval` seconds, step counts mixed so that
jobs finish, and new ones are admitted, while others run) goes through an engine once
with `encode_overlap=False` (a new job's prompts are encoded inside the loop iteration
that admits it: every running job waits) and once with `encode_overlap=True` (an
encoder thread; a job joins the forwards once its prompts are encoded), each variant
in a process of its own, alternating off/on `--repeats` times. `--encode-repeats`
makes the text encoder do its real work that many times per call, so that one encode
costs several denoise steps, as a T5-XXL encode of long prompts does beside a FLUX
forward on a GPU; real CPU work, not a sleep, so the two threads truly compete for the
cores. Decode runs as the engine's default for the device unless `--decode-overlap`.

Figures per run: the longest gap between two consecutive denoise steps of one running
job (max stall: from one step's completion to the next, as its on_progress callbacks
see them), the 95th percentile and median of those gaps, images/s (first submit to
last result), the forward time per forward and the encode time per text-encoder call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks import overlap_common

STEP_COUNTS = (6, 10, 8, 12, 7, 9, 11, 5)


def run_variant(args: argparse.Namespace, overlap: bool) -> dict:
    """One variant in this process: build, warm up, run the stream, return the figures."""
    from batching import DiffusionEngine, EngineConfig

    config = EngineConfig(
        model=args.model,
        device=args.device,
        max_num_seqs=args.max_num_seqs,
        encode_overlap=overlap,
        decode_overlap=None if args.decode_overlap is None else args.decode_overlap == "on",
        num_threads=args.threads,
    )
    with DiffusionEngine(config) as engine:
        adapter = engine.model_runner.model
        real_encode = adapter.encode_prompts
        encode_calls: list[float] = []

        def costly_encode(texts):
            start = time.perf_counter()
            for _ in range(args.encode_repeats - 1):
                real_encode(texts)
            encoded = real_encode(texts)
            encode_calls.append(time.perf_counter() - start)
            return encoded

        adapter.encode_prompts = costly_encode  # type: ignore[method-assign]  # a slower encoder, timed

        def params(index: int, steps: int):
            return overlap_common.job_params(args, "a lighthouse on a cliff", index, steps)

        engine.submit(params(999, 2)).result()  # warm-up (every thread runs torch work once), not timed
        encode_calls.clear()
        before = engine.stats()
        step_times: dict[int, list[float]] = {}

        def on_progress_of(index: int):
            times = step_times.setdefault(index, [])
            return lambda done, total: times.append(time.perf_counter())

        start = time.perf_counter()
        futures = []
        for index in range(args.jobs):
            delay = start + index * args.interval - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            steps = STEP_COUNTS[index % len(STEP_COUNTS)]
            futures.append(engine.submit(params(index, steps), on_progress=on_progress_of(index)))
        for future in futures:
            future.result()
        wall = time.perf_counter() - start
        after = engine.stats()
    gaps = sorted(later - earlier for times in step_times.values() for earlier, later in zip(times, times[1:]))
    num_forwards = max(1, after["forwards"] - before["forwards"])
    return {
        "encode_overlap": overlap,
        "decode_overlap": after["decode_overlap"],
        "wall_seconds": wall,
        "images_per_second": args.jobs / wall,
        "max_stall_seconds": gaps[-1],
        "p95_step_gap_seconds": gaps[int(0.95 * (len(gaps) - 1))],
        "median_step_gap_seconds": statistics.median(gaps),
        "forward_seconds_per_forward": (after["forward_seconds"] - before["forward_seconds"]) / num_forwards,
        "encode_seconds_per_call": statistics.median(encode_calls) if encode_calls else 0.0,
        "num_encode_calls": len(encode_calls),
        "jobs_finished": after["jobs_finished"] - before["jobs_finished"],
    }


FIGURES = (
    "images_per_second",
    "max_stall_seconds",
    "p95_step_gap_seconds",
    "median_step_gap_seconds",
    "forward_seconds_per_forward",
    "encode_seconds_per_call",
)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    overlap_common.add_engine_arguments(parser, size=64, jobs=16)
    parser.add_argument("--interval", type=float, default=0.15, help="seconds between two arrivals")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--encode-repeats", type=int, default=20, help="real encodes per encode call (its cost)")
    parser.add_argument("--decode-overlap", choices=("on", "off"), help="default: the engine's for the device")
    overlap_common.add_comparison_arguments(parser)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    overlap_common.add_output_arguments(parser)
    args = parser.parse_args(argv)
    step_counts = [STEP_COUNTS[i % len(STEP_COUNTS)] for i in range(args.jobs)]
    summary = overlap_common.variant_or_summary(
        args, run_variant, lambda: overlap_common.compare("benchmarks.encode_overlap", args, argv, step_counts, FIGURES)
    )
    if summary is None:
        return
    print(
        f"{args.jobs} jobs arriving every {args.interval}s (steps {sorted(set(summary['step_counts']))}), "
        f"{args.model} {args.size}x{args.size}, max_num_seqs={args.max_num_seqs}, encode x{args.encode_repeats}, "
        f"{args.threads} torch thread(s), median of {args.repeats} per variant"
    )
    print(
        f"{'encode':>7} {'images/s':>9} {'max stall s':>12} {'p95 gap s':>10} {'median gap s':>13} "
        f"{'fwd s':>7} {'encode s/call':>14}"
    )
    for name, figures in summary["median"].items():
        print(
            f"{name:>7} {figures['images_per_second']:9.3f} {figures['max_stall_seconds']:12.3f} "
            f"{figures['p95_step_gap_seconds']:10.3f} {figures['median_step_gap_seconds']:13.3f} "
            f"{figures['forward_seconds_per_forward']:7.3f} {figures['encode_seconds_per_call']:14.3f}"
        )
    off, on = summary["median"]["off"], summary["median"]["on"]
    print(
        f"on/off: images/s {on['images_per_second'] / off['images_per_second']:.2f}x, "
        f"max stall {on['max_stall_seconds'] / off['max_stall_seconds']:.2f}x"
    )


if __name__ == "__main__":
    main()
