"""Decode beside the loop vs inline, on this machine: images/s and how busy the denoiser was.

    python -m benchmarks.decode_overlap [--model builtin:tiny] [--size 96] [--jobs 8] [--decode-repeats 3]
                                        [--repeats 2] [--device cpu] [--json FILE]

A burst of jobs with mixed step counts (so they finish at staggered times, each finish
a decode while others still step) runs once with `decode_overlap=False` (decode inline:
the loop waits for it) and once with `decode_overlap=True` (decode worker thread),
each variant in a process of its own (a process that once ran torch work on a second
thread keeps paying for it), alternating on/off `--repeats` times. `--decode-repeats`
makes the decoder do its real VAE work that many times, so that one decode costs
several denoise steps as at 1024x1024 on a GPU; the work is real CPU work, not a sleep,
so the two threads truly compete for the cores.

Figures per run: images/s over the burst (first submit to last result), the
denoiser-busy fraction (summed forward time / wall time: how much of the run the
denoiser was computing), the engine-busy fraction (time inside loop iterations / wall),
and the decode time per image.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks import overlap_common

STEP_COUNTS = (4, 6, 8, 10, 12, 5, 7, 9)


def run_variant(args: argparse.Namespace, overlap: bool) -> dict:
    """One variant in this process: build, warm up, time the burst, return the figures."""
    from batching import DiffusionEngine, EngineConfig

    config = EngineConfig(
        model=args.model,
        device=args.device,
        max_num_seqs=args.max_num_seqs,
        decode_overlap=overlap,
        num_threads=args.threads,
    )
    with DiffusionEngine(config) as engine:
        adapter = engine.model_runner.model
        real_decode = adapter.decode

        def costly_decode(latents, params_list):
            for _ in range(args.decode_repeats - 1):
                real_decode(latents, params_list)
            return real_decode(latents, params_list)

        adapter.decode = costly_decode  # type: ignore[method-assign]  # a slower decoder, timed

        def params(index: int, steps: int):
            return overlap_common.job_params(args, "a lighthouse", index, steps)

        engine.submit(params(999, 2)).result()  # warm-up (both threads run torch work once), not timed
        before = engine.stats()
        start = time.perf_counter()
        futures = [engine.submit(params(i, STEP_COUNTS[i % len(STEP_COUNTS)])) for i in range(args.jobs)]
        for future in futures:
            future.result()
        wall = time.perf_counter() - start
        after = engine.stats()
    delta = {
        name: after[name] - before[name]
        for name in ("forward_seconds", "busy_seconds", "decode_seconds", "jobs_finished", "job_steps")
    }
    return {
        "decode_overlap": overlap,
        "wall_seconds": wall,
        "images_per_second": args.jobs / wall,
        "denoiser_busy_fraction": delta["forward_seconds"] / wall,
        "engine_busy_fraction": delta["busy_seconds"] / wall,
        "decode_seconds_per_image": delta["decode_seconds"] / delta["jobs_finished"],
        "forward_seconds_per_step": delta["forward_seconds"] / max(1, after["forwards"] - before["forwards"]),
        "jobs_finished": delta["jobs_finished"],
    }


FIGURES = (
    "images_per_second",
    "denoiser_busy_fraction",
    "engine_busy_fraction",
    "decode_seconds_per_image",
    "forward_seconds_per_step",
)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    overlap_common.add_engine_arguments(parser, size=96, jobs=8)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--decode-repeats", type=int, default=3, help="real decodes per decode call (its cost)")
    overlap_common.add_comparison_arguments(parser)
    parser.add_argument("--threads", type=int, default=None)
    overlap_common.add_output_arguments(parser)
    args = parser.parse_args(argv)
    summary = overlap_common.variant_or_summary(
        args,
        run_variant,
        lambda: overlap_common.compare(
            "benchmarks.decode_overlap", args, argv, list(STEP_COUNTS[: args.jobs]), FIGURES
        ),
    )
    if summary is None:
        return
    print(
        f"{args.jobs} jobs (steps {summary['step_counts']}), {args.model} {args.size}x{args.size}, "
        f"max_num_seqs={args.max_num_seqs}, decode x{args.decode_repeats}, median of {args.repeats} per variant"
    )
    print(
        f"{'decode':>8} {'images/s':>9} {'denoiser busy':>14} {'engine busy':>12} "
        f"{'decode s/img':>13} {'fwd s/step':>11}"
    )
    for name, figures in summary["median"].items():
        print(
            f"{name:>8} {figures['images_per_second']:9.3f} {figures['denoiser_busy_fraction']:14.1%} "
            f"{figures['engine_busy_fraction']:12.1%} {figures['decode_seconds_per_image']:13.3f} "
            f"{figures['forward_seconds_per_step']:11.3f}"
        )


if __name__ == "__main__":
    main()
