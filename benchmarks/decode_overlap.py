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
import json
import subprocess
import sys
import time

STEP_COUNTS = (4, 6, 8, 10, 12, 5, 7, 9)


def run_variant(args: argparse.Namespace, overlap: bool) -> dict:
    """One variant in this process: build, warm up, time the burst, return the figures."""
    from batching import DiffusionEngine, EngineConfig, GenerationParams

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

        adapter.decode = costly_decode

        def params(index: int, steps: int) -> GenerationParams:
            return GenerationParams(
                prompt=f"a lighthouse, picture {index}",
                seed=index,
                model=args.model,
                num_inference_steps=steps,
                height=args.size,
                width=args.size,
            )

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


def compare(args: argparse.Namespace, argv: list[str]) -> dict:
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for _ in range(args.repeats):
        for name in ("off", "on"):
            completed = subprocess.run(
                [sys.executable, "-m", "benchmarks.decode_overlap", *argv, "--variant", name],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[name].append(json.loads(completed.stdout.strip().splitlines()[-1]))
    summary = {
        "settings": {key: value for key, value in vars(args).items() if key not in ("variant", "json")},
        "step_counts": list(STEP_COUNTS[: args.jobs]),
        "runs": runs,
    }
    summary["median"] = {
        name: {
            key: sorted(run[key] for run in results)[len(results) // 2]
            for key in (
                "images_per_second",
                "denoiser_busy_fraction",
                "engine_busy_fraction",
                "decode_seconds_per_image",
                "forward_seconds_per_step",
            )
        }
        for name, results in runs.items()
    }
    return summary


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--decode-repeats", type=int, default=3, help="real decodes per decode call (its cost)")
    parser.add_argument("--repeats", type=int, default=2, help="off/on pairs, alternating")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", help="also write the summary here")
    parser.add_argument("--variant", choices=("on", "off"), help=argparse.SUPPRESS)  # one variant, in this process
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(args, args.variant == "on")))
        return
    summary = compare(args, argv)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(summary, file, indent=2)
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
