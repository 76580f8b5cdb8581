"""What live previews cost: images/s of a burst with previews every 4 steps vs none, on this machine.

    python -m benchmarks.previews [--model builtin:tiny] [--size 128] [--jobs 16] [--steps 20] [--every 4]
                                  [--max-num-seqs 8] [--threads 1] [--repeats 1] [--device cpu] [--json FILE]

A burst of `--jobs` jobs runs once with no previews ("off") and once with every job asking for one
every `--every` steps ("on"), each variant in a process of its own, alternating `--repeats` times.
In "on" the engine makes each preview on its loop thread (the latent-to-RGB matmul) and hands it
to a callback that queues it; a second thread encodes each one into its WebP data URI, as a
worker's task thread does (the Redis write that follows is not the engine's and is left out). The
figure is images/s over the burst (first submit to last result); the ratio on/off is printed.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time

from benchmarks import overlap_common


def run_variant(args: argparse.Namespace, previews_on: bool) -> dict:
    """One variant in this process: build, warm up, time the burst, return its figures."""
    from batching import DiffusionEngine, EngineConfig

    config = EngineConfig(
        model=args.model, device=args.device, max_num_seqs=args.max_num_seqs, num_threads=args.threads
    )
    made: queue.Queue = queue.Queue()
    encoded: list[int] = []

    def encode_previews() -> None:  # the worker's task threads' part
        while (preview := made.get()) is not None:
            encoded.append(len(preview.data_uri()))
            made.task_done()

    encoder = threading.Thread(target=encode_previews, daemon=True)
    encoder.start()
    every = args.every if previews_on else 0
    with DiffusionEngine(config) as engine:

        def submit(index: int, steps: int):
            params = overlap_common.job_params(args, "a lighthouse", index, steps)
            return engine.submit(params, preview_every=every, on_preview=made.put)

        submit(999, 2 * max(1, args.every)).result()  # warm-up (both threads run once), not timed
        made.join()  # the warm-up's previews are encoded
        num_before = len(encoded)
        start = time.perf_counter()
        futures = [submit(i, args.steps) for i in range(args.jobs)]
        for future in futures:
            future.result()
        wall = time.perf_counter() - start
    made.put(None)
    encoder.join()
    num_previews = len(encoded) - num_before
    return {
        "previews": previews_on,
        "wall_seconds": wall,
        "images_per_second": args.jobs / wall,
        "num_previews": num_previews,
        "preview_bytes": sum(encoded[num_before:]) / max(1, num_previews),
    }


FIGURES = ("images_per_second", "wall_seconds", "num_previews", "preview_bytes")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    overlap_common.add_engine_arguments(parser, size=128, jobs=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=4, help="steps between previews in the 'on' variant")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each variant (pinned: FACTS.md)")
    parser.add_argument("--repeats", type=int, default=1, help="off/on pairs, alternating")
    overlap_common.add_output_arguments(parser)
    args = parser.parse_args(argv)
    summary = overlap_common.variant_or_summary(
        args,
        run_variant,
        lambda: overlap_common.compare("benchmarks.previews", args, argv, [args.steps] * args.jobs, FIGURES),
    )
    if summary is None:
        return
    median = summary["median"]
    summary["ratio_on_over_off"] = median["on"]["images_per_second"] / median["off"]["images_per_second"]
    if args.json:  # again, with the ratio
        import json

        with open(args.json, "w") as file:
            json.dump(summary, file, indent=2)
    print(
        f"{args.jobs} jobs x {args.steps} steps, {args.model} {args.size}x{args.size}, "
        f"max_num_seqs={args.max_num_seqs}, {args.threads} torch thread(s), median of {args.repeats} per variant"
    )
    print(f"{'previews':>9} {'images/s':>9} {'wall s':>7} {'previews':>9} {'bytes each':>11}")
    for name, figures in median.items():
        print(
            f"{name:>9} {figures['images_per_second']:9.3f} {figures['wall_seconds']:7.2f} "
            f"{figures['num_previews']:9d} {figures['preview_bytes']:11.0f}"
        )
    print(f"images/s with previews every {args.every} steps / without: {summary['ratio_on_over_off']:.3f}")


if __name__ == "__main__":
    main()
