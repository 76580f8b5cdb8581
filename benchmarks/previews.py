"""What live previews cost: images/s of a burst with previews every 4 steps vs none, on this machine.

    python -m benchmarks.previews [--model builtin:tiny] [--size 128] [--jobs 16] [--steps 20] [--every 4]
                                  [--max-num-seqs 8] [--threads 1] [--repeats 1] [--device cpu] [--json FILE]

A burst of `--jobs` jobs runs once with no previews ("off") and once with every job asking for one
every `--every` steps ("on"), each variant in a process of its own, `--repeats` pairs alternating
(off on, on off, off on, ...: neither variant always runs first).
In "on" the engine makes each preview on its loop thread (the latent-to-RGB matmul) and hands it
to a callback that queues it; a second thread encodes each one into its JPEG data URI, as a
worker's job thread does (the Redis write that follows is not the engine's and is left out).

Figures per run: images/s over the burst (first submit to last result), and the ratio on/off of
their medians (and the median of each "on" run's ratio to the "off" run beside it); CPU
seconds per image of the whole process (both threads; less swayed than wall time by other work
on a shared machine); and, in "on", the seconds the loop thread spent making previews and the
encoding thread spent encoding them, as shares of the burst's wall time.
"""

from __future__ import annotations

import argparse
import json
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
    seconds = {"make": 0.0, "encode": 0.0}

    def encode_previews() -> None:  # the worker's job threads' part
        while (preview := made.get()) is not None:
            started = time.perf_counter()
            encoded.append(len(preview.data_uri()))
            seconds["encode"] += time.perf_counter() - started
            made.task_done()

    encoder = threading.Thread(target=encode_previews, daemon=True)
    encoder.start()
    every = args.every if previews_on else 0
    with DiffusionEngine(config) as engine:
        maker = engine.model_runner.preview_maker
        assert maker is not None, f"{args.model} has no latent-to-RGB factors"
        real_make = maker.make

        def timed_make(latents, params):
            started = time.perf_counter()
            made_pixels = real_make(latents, params)
            seconds["make"] += time.perf_counter() - started
            return made_pixels

        maker.make = timed_make  # type: ignore[method-assign]

        def submit(index: int, steps: int):
            params = overlap_common.job_params(args, "a lighthouse", index, steps)
            return engine.submit(params, preview_every=every, on_preview=made.put)

        submit(999, 2 * max(1, args.every)).result()  # warm-up (both threads run once), not timed
        made.join()  # the warm-up's previews are encoded
        num_before = len(encoded)
        seconds.update(make=0.0, encode=0.0)
        start, cpu_start = time.perf_counter(), time.process_time()
        futures = [submit(i, args.steps) for i in range(args.jobs)]
        for future in futures:
            future.result()
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
    made.put(None)
    encoder.join()
    num_previews = len(encoded) - num_before
    return {
        "previews": previews_on,
        "wall_seconds": wall,
        "images_per_second": args.jobs / wall,
        "cpu_seconds_per_image": cpu / args.jobs,
        "make_share": seconds["make"] / wall,
        "encode_share": seconds["encode"] / wall,
        "num_previews": num_previews,
        "preview_bytes": sum(encoded[num_before:]) / max(1, num_previews),
    }


def same_process(args: argparse.Namespace) -> dict:
    """`--same-process N`: one engine, N bursts of each variant alternating (off on, on off, ...): the process's
    CPU and wall time of each, and the CPU time of the engine loop thread and of the encoding thread (thread
    clocks, which other processes' load sways least). No process-to-process spread, only the load's."""
    from batching import DiffusionEngine, EngineConfig

    config = EngineConfig(
        model=args.model, device=args.device, max_num_seqs=args.max_num_seqs, num_threads=args.threads
    )
    made: queue.Queue = queue.Queue()
    thread_cpu = {"loop": 0.0, "encode": 0.0}

    def encode_previews() -> None:
        while (preview := made.get()) is not None:
            started = time.thread_time()
            preview.data_uri()
            thread_cpu["encode"] += time.thread_time() - started
            made.task_done()

    threading.Thread(target=encode_previews, daemon=True).start()
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    with DiffusionEngine(config) as engine:
        real_step = engine.step

        def timed_step() -> bool:  # on the loop thread
            started = time.thread_time()
            did_work = real_step()
            thread_cpu["loop"] += time.thread_time() - started
            return did_work

        engine.step = timed_step  # type: ignore[method-assign]

        def burst(every: int, first_index: int) -> None:
            futures = [
                engine.submit(
                    overlap_common.job_params(args, "a lighthouse", first_index + i, args.steps),
                    preview_every=every,
                    on_preview=made.put,
                )
                for i in range(args.jobs)
            ]
            for future in futures:
                future.result()

        burst(args.every, 1000)  # warm-up
        made.join()
        for repeat in range(args.same_process):
            for name in ("on", "off") if repeat % 2 else ("off", "on"):
                thread_cpu.update(loop=0.0, encode=0.0)
                cpu, wall = time.process_time(), time.perf_counter()
                burst(args.every if name == "on" else 0, 0)
                made.join()  # its previews are encoded
                runs[name].append(
                    {
                        "cpu_seconds": time.process_time() - cpu,
                        "wall_seconds": time.perf_counter() - wall,
                        "loop_cpu_seconds": thread_cpu["loop"],
                        "encode_cpu_seconds": thread_cpu["encode"],
                    }
                )
    made.put(None)
    median = {
        name: {key: sorted(run[key] for run in results)[len(results) // 2] for key in results[0]}
        for name, results in runs.items()
    }
    for figures in median.values():
        figures["images_per_second"] = args.jobs / figures["wall_seconds"]
    return {"settings": vars(args), "runs": runs, "median": median}


FIGURES = (
    "images_per_second",
    "wall_seconds",
    "cpu_seconds_per_image",
    "make_share",
    "encode_share",
    "num_previews",
    "preview_bytes",
)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    overlap_common.add_engine_arguments(parser, size=128, jobs=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=4, help="steps between previews in the 'on' variant")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each variant (pinned: FACTS.md)")
    parser.add_argument("--repeats", type=int, default=1, help="off/on pairs, alternating")
    parser.add_argument(
        "--same-process", type=int, default=0, metavar="N", help="instead: N bursts of each variant in one process"
    )
    overlap_common.add_output_arguments(parser)
    args = parser.parse_args(argv)
    if args.same_process:
        result = same_process(args)
        if args.json:
            with open(args.json, "w") as file:
                json.dump(result, file, indent=2)
        off, on = result["median"]["off"], result["median"]["on"]
        print(f"{args.jobs} jobs x {args.steps} steps in one process, {args.same_process} bursts per variant")
        for name, figures in result["median"].items():
            print(
                f"{name:>4}: {figures['images_per_second']:.3f} images/s, CPU s per burst: process "
                f"{figures['cpu_seconds']:.3f}, loop thread {figures['loop_cpu_seconds']:.3f}, "
                f"encoding thread {figures['encode_cpu_seconds']:.4f}"
            )
        print(
            f"with previews every {args.every} steps / without (medians): "
            f"images/s {on['images_per_second'] / off['images_per_second']:.3f}, "
            f"process CPU {on['cpu_seconds'] / off['cpu_seconds']:.3f}, "
            f"loop thread CPU {on['loop_cpu_seconds'] / off['loop_cpu_seconds']:.3f}, "
            f"encoding {on['encode_cpu_seconds'] / off['cpu_seconds']:.2%} of the process's CPU without previews"
        )
        return
    summary = overlap_common.variant_or_summary(
        args,
        run_variant,
        lambda: overlap_common.compare(
            "benchmarks.previews", args, argv, [args.steps] * args.jobs, FIGURES, swaps_order=True
        ),
    )
    if summary is None:
        return
    median = summary["median"]
    summary["ratio_on_over_off"] = median["on"]["images_per_second"] / median["off"]["images_per_second"]
    summary["cpu_ratio_on_over_off"] = median["on"]["cpu_seconds_per_image"] / median["off"]["cpu_seconds_per_image"]
    pairs = sorted(on["images_per_second"] / off["images_per_second"] for off, on in zip(*summary["runs"].values()))
    summary["pair_ratios"] = pairs  # each "on" run over the "off" run beside it (slow drifts of load cancel)
    summary["median_pair_ratio"] = pairs[len(pairs) // 2]
    if args.json:  # again, with the ratios
        with open(args.json, "w") as file:
            json.dump(summary, file, indent=2)
    print(
        f"{args.jobs} jobs x {args.steps} steps, {args.model} {args.size}x{args.size}, "
        f"max_num_seqs={args.max_num_seqs}, {args.threads} torch thread(s), median of {args.repeats} per variant"
    )
    print(
        f"{'previews':>9} {'images/s':>9} {'wall s':>7} {'CPU s/image':>12} {'make':>7} {'encode':>7} "
        f"{'previews':>9} {'bytes each':>11}"
    )
    for name, figures in median.items():
        print(
            f"{name:>9} {figures['images_per_second']:9.3f} {figures['wall_seconds']:7.2f} "
            f"{figures['cpu_seconds_per_image']:12.3f} {figures['make_share']:7.2%} {figures['encode_share']:7.2%} "
            f"{figures['num_previews']:9d} {figures['preview_bytes']:11.0f}"
        )
    runs = summary["runs"]
    print("images/s per run:", {name: [round(run["images_per_second"], 3) for run in runs[name]] for name in runs})
    print(
        f"with previews every {args.every} steps / without: images/s {summary['ratio_on_over_off']:.3f}, "
        f"CPU seconds per image {summary['cpu_ratio_on_over_off']:.3f}; median of the adjacent pairs' "
        f"images/s ratios {summary['median_pair_ratio']:.3f}"
    )


if __name__ == "__main__":
    main()
