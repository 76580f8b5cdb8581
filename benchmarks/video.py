"""Video serving side by side: what step-level batching buys a video model (`stepwise bench --model builtin:tiny-wan`).

    python -m benchmarks.video [--model builtin:tiny-wan] [--jobs 8] [--steps 8] [--threads 1] [--out DIR]

Throughput, videos per second, for two bursts (every video submitted at once):
- `uniform`: `--jobs` videos of one shape (64x64, 17 frames), with different prompts and seeds;
- `mixed`: the same number of videos of three shapes (64x64x17, 96x64x9, 64x96x25) and three step counts;
each served three ways:
- `serial`: the stepwise engine with `max_num_seqs=1` (no batching);
- `static`: what a user does without stepwise: diffusers' own pipeline (`WanPipeline`) called with prompt lists and
  one generator per video, one call per group of up to `--max-num-seqs` videos of one shape, step count and
  guidance (what one call holds fixed), groups in arrival order;
- `default`: the stepwise engine (`max_num_seqs` `--max-num-seqs`, its default policy and token budget).

Priorities, interactive images beside a video backfill on one engine (`default`, `max_num_seqs` 4): 8 images
(one-frame jobs of the same model, 64x64, `--steps` steps) arrive one every `--image-gap` seconds while 16
low-priority videos (64x64, 33 frames, 48 steps) were all queued at the start, enough to outlast the images.
Image latency (submit to result) p50 and p95:
- `images-alone`: the images on an idle engine (the reference);
- `images+backfill`: images at `high`, the backfill at `low` (preempted at a step boundary when there is no room);
- `images+backfill-no-priority`: both at `normal` (the images wait behind the running videos).

Every variant runs in its own process (one torch thread unless `--threads`), after a warm-up at each shape it
runs. Writes `video.json` and `video.md` into `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

THROUGHPUT_VARIANTS = ("serial", "static", "default")
PRIORITY_VARIANTS = ("images-alone", "images+backfill", "images+backfill-no-priority")
WORKLOADS = ("uniform", "mixed")
UNIFORM_SHAPE = (64, 64, 17)  # (height, width, frames)
MIXED_SHAPES = ((64, 64, 17), (64, 96, 9), (96, 64, 25))
NUM_IMAGES = 8
NUM_BACKFILL = 16
BACKFILL_SHAPE = (64, 64, 33)
BACKFILL_STEPS = 48
GUIDANCE = 5.0  # the family's default: two rows per video
PROMPTS = ("a red fox running in snow", "waves on a beach at dusk", "a city street in the rain", "a cat yawning")


@dataclass(frozen=True)
class Options:
    model: str
    num_jobs: int
    num_steps: int
    max_num_seqs: int
    num_threads: int
    image_gap: float


def video_params(options: Options, workload: str) -> list[dict]:
    """The workload's videos as GenerationParams fields, in arrival order."""
    jobs = []
    for index in range(options.num_jobs):
        if workload == "uniform":
            (height, width, frames), steps = UNIFORM_SHAPE, options.num_steps
        else:
            height, width, frames = MIXED_SHAPES[index % len(MIXED_SHAPES)]
            steps = (options.num_steps // 2, options.num_steps, options.num_steps * 3 // 2)[index // 3 % 3]
        jobs.append(
            dict(
                prompt=PROMPTS[index % len(PROMPTS)],
                model=options.model,
                seed=100 + index,
                height=height,
                width=width,
                num_frames=frames,
                num_inference_steps=steps,
                guidance_scale=GUIDANCE,
            )
        )
    return jobs


# ---- children: one variant in this process ----


def run_throughput(options: Options, variant: str, workload: str) -> dict:
    import torch

    from batching import GenerationParams

    torch.set_num_threads(options.num_threads)
    jobs = [GenerationParams(**fields) for fields in video_params(options, workload)]
    shapes = {(job.height, job.width, job.num_frames): job for job in jobs}.values()
    warm_ups = [  # a full group at each shape: the first forward at a batch size is slow, and not measured
        dataclasses.replace(job, num_inference_steps=1, seed=index)
        for job in shapes
        for index in range(options.max_num_seqs)
    ]
    if variant == "static":
        call = static_caller(options)
        for group in static_groups(warm_ups, options.max_num_seqs):
            call(group)
        started, cpu_started = time.perf_counter(), cpu_seconds()
        for group in static_groups(jobs, options.max_num_seqs):
            call(group)
        wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started
        return {
            "wall_seconds": wall,
            "cpu_seconds": cpu,
            "num_videos": len(jobs),
            "num_calls": len(static_groups(jobs, options.max_num_seqs)),
        }
    engine = open_engine(options, 1 if variant == "serial" else options.max_num_seqs)
    try:
        for future in [engine.submit(job) for job in warm_ups]:
            future.result()
        before = engine.stats()
        started, cpu_started = time.perf_counter(), cpu_seconds()
        for future in [engine.submit(job) for job in jobs]:
            future.result()
        wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started
        after = engine.stats()
    finally:
        engine.shutdown()
    num_forwards = after["forwards"] - before["forwards"]
    return {"wall_seconds": wall, "cpu_seconds": cpu, "num_videos": len(jobs), "num_forwards": num_forwards}


def cpu_seconds() -> float:
    """CPU time of this process, every thread: the work a variant did, whatever else the machine ran meanwhile."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def static_groups(jobs: list, max_group: int) -> list[list]:
    """Groups of up to `max_group` jobs one pipeline call can run (one shape, step count and guidance), in the order
    their first job arrived."""
    by_key: dict[tuple, list] = {}
    for job in jobs:
        key = (job.height, job.width, job.num_frames, job.num_inference_steps, job.guidance_scale)
        by_key.setdefault(key, []).append(job)
    return [group[i : i + max_group] for group in by_key.values() for i in range(0, len(group), max_group)]


def static_caller(options: Options):
    import torch

    from batching.model_loading import model_source
    from batching.pipelines import adapter_serving, resolve_device, resolve_dtype

    device = resolve_device("cpu")
    source = model_source(options.model)
    adapter = adapter_serving(options.model, source)
    pipeline = adapter.load_pipeline(options.model, source, device, resolve_dtype("auto", device))
    pipeline.set_progress_bar_config(disable=True)

    def call(group: list) -> None:
        first = group[0]
        pipeline(
            prompt=[job.prompt for job in group],
            negative_prompt=[job.negative_prompt for job in group],
            height=first.height,
            width=first.width,
            num_frames=first.num_frames,
            num_inference_steps=first.num_inference_steps,
            guidance_scale=first.guidance_scale,
            generator=[torch.Generator("cpu").manual_seed(job.seed) for job in group],
            output_type="pil",
        )

    return call


def open_engine(options: Options, max_num_seqs: int):
    from batching import DiffusionEngine, EngineConfig

    config = EngineConfig(model=options.model, device="cpu", max_num_seqs=max_num_seqs, num_threads=options.num_threads)
    return DiffusionEngine(config)


def run_priority(options: Options, variant: str) -> dict:
    import torch

    from batching import GenerationParams

    torch.set_num_threads(options.num_threads)
    height, width, frames = BACKFILL_SHAPE
    steps = BACKFILL_STEPS
    backfill = [
        GenerationParams(
            **{**fields, "height": height, "width": width, "num_frames": frames, "num_inference_steps": steps}
        )
        for fields in video_params(dataclasses.replace(options, num_jobs=NUM_BACKFILL), "uniform")
    ]
    images = [
        GenerationParams(
            prompt=PROMPTS[i % len(PROMPTS)],
            model=options.model,
            seed=500 + i,
            height=64,
            width=64,
            num_frames=1,
            num_inference_steps=options.num_steps,
            guidance_scale=GUIDANCE,
        )
        for i in range(NUM_IMAGES)
    ]
    engine = open_engine(options, 4)
    try:
        warm = [GenerationParams(**{**p.to_dict(), "num_inference_steps": 1}) for p in (backfill[0], images[0])]
        for future in [engine.submit(p) for p in warm]:
            future.result()
        started = time.perf_counter()
        videos = []
        if variant != "images-alone":
            low = "low" if variant == "images+backfill" else "normal"
            videos = [engine.submit(p, priority=low) for p in backfill]
        high = "high" if variant == "images+backfill" else "normal"
        submitted: list[float] = []
        finished: dict[int, float] = {}
        futures = []
        for index, params in enumerate(images):  # at their arrival times, whether or not the last one is done
            time.sleep(max(0.0, started + options.image_gap * (index + 1) - time.perf_counter()))
            submitted.append(time.perf_counter())
            future = engine.submit(params, priority=high)
            future.add_done_callback(lambda _, index=index: finished.setdefault(index, time.perf_counter()))
            futures.append(future)
        for future in futures:
            future.result()
        latencies = [finished[index] - submitted[index] for index in range(len(images))]
        images_done = max(finished.values())
        for future in videos:
            future.result()
        wall = time.perf_counter() - started
    finally:
        engine.shutdown()
    return {
        "image_latencies": latencies,
        "image_p50": percentile(latencies, 0.5),
        "image_p95": percentile(latencies, 0.95),
        "images_seconds": images_done - started,
        "num_videos": len(videos),
        "wall_seconds": wall,  # the first submit to the last video (or image, with no backfill)
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# ---- the parent: every variant in its own process, then the report ----


def child(options: Options, kind: str, variant: str, workload: str = "") -> dict:
    argv = [sys.executable, "-m", "benchmarks.video", "--model", options.model, "--jobs", str(options.num_jobs)]
    argv += ["--steps", str(options.num_steps), "--max-num-seqs", str(options.max_num_seqs)]
    argv += ["--threads", str(options.num_threads), "--image-gap", str(options.image_gap)]
    argv += ["--child", kind, variant, workload or "-"]
    env = {**os.environ, "OMP_NUM_THREADS": str(options.num_threads), "TQDM_DISABLE": "1"}
    load_start = os.getloadavg()[0]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} {variant} {workload}: exit {done.returncode}\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["load_average"] = [load_start, os.getloadavg()[0]]
    return result


def run_all(options: Options, rounds: int) -> dict:
    """`rounds` rounds of every throughput variant in turn (so the machine's drifts fall on all alike), the median
    kept; then the priority variants once."""
    runs: dict[str, dict[str, list[dict]]] = {}
    for _ in range(rounds):
        for workload in WORKLOADS:
            for variant in THROUGHPUT_VARIANTS:
                result = child(options, "throughput", variant, workload)
                result["videos_per_second"] = result["num_videos"] / result["wall_seconds"]
                result["videos_per_cpu_second"] = result["num_videos"] / result["cpu_seconds"]
                runs.setdefault(workload, {}).setdefault(variant, []).append(result)
                wall, cpu = result["videos_per_second"], result["videos_per_cpu_second"]
                print(f"{workload:8} {variant:8} {wall:.3f} videos/s, {cpu:.3f} per CPU-second", file=sys.stderr)
    throughput = {
        workload: {
            variant: {
                "videos_per_second": statistics.median(run["videos_per_second"] for run in results),
                "videos_per_cpu_second": statistics.median(run["videos_per_cpu_second"] for run in results),
                "runs": results,
            }
            for variant, results in variants.items()
        }
        for workload, variants in runs.items()
    }
    priority = {}
    for variant in PRIORITY_VARIANTS:
        priority[variant] = child(options, "priority", variant)
        print(f"{variant:28} image p95 {priority[variant]['image_p95']:.2f}s", file=sys.stderr)
    ratios = {
        f"{workload}_default_over_{other}{suffix}": throughput[workload]["default"][measure]
        / throughput[workload][other][measure]
        for workload in WORKLOADS
        for other in ("serial", "static")
        for measure, suffix in (("videos_per_cpu_second", ""), ("videos_per_second", "_wall"))
    }
    return {
        "options": vars(options),
        "throughput": throughput,
        "priority": priority,
        "ratios": ratios,
        "cpu_count": os.cpu_count(),
        "rounds": rounds,
    }


def markdown(summary: dict, command: str) -> str:
    options = summary["options"]
    lines = [
        f"# Video serving: {options['model']}",
        "",
        f"`{command}`: {options['num_jobs']} videos per burst, {options['num_steps']} steps (mixed: half, 1x and "
        f"1.5x), guidance {GUIDANCE}, max_num_seqs {options['max_num_seqs']}, {options['num_threads']} torch "
        f"thread(s), each variant in its own process, median of {summary['rounds']} alternating rounds; "
        f"{summary['cpu_count']} CPUs.",
        "",
        "Videos per CPU-second (the process's CPU time over the burst, every thread: the work each variant did, "
        "whatever else the shared machine ran) and, in brackets, per wall-clock second:",
        "",
        "| burst | serial | static | default | default / serial | default / static |",
        "|---|---|---|---|---|---|",
    ]
    ratios = summary["ratios"]
    for workload, variants in summary["throughput"].items():
        rates = [
            f"{variants[name]['videos_per_cpu_second']:.2f} ({variants[name]['videos_per_second']:.2f})"
            for name in THROUGHPUT_VARIANTS
        ]
        over = [
            (ratios[f"{workload}_default_over_{other}"], ratios[f"{workload}_default_over_{other}_wall"])
            for other in ("serial", "static")
        ]
        shown = [f"{cpu:.2f}x ({wall:.2f}x)" for cpu, wall in over]
        lines.append(f"| {workload} | {' | '.join(rates)} | {' | '.join(shown)} |")
    lines += [
        "",
        f"{NUM_IMAGES} interactive images (64x64, one frame, {options['num_steps']} steps) one every "
        f"{options['image_gap']:g} s beside {NUM_BACKFILL} queued videos ({BACKFILL_SHAPE[1]}x"
        f"{BACKFILL_SHAPE[0]}, {BACKFILL_SHAPE[2]} frames, {BACKFILL_STEPS} steps) on "
        "one engine (max_num_seqs 4):",
        "",
        "| variant | image p50 | image p95 | images done after | backfill done after |",
        "|---|---|---|---|---|",
    ]
    for variant, result in summary["priority"].items():
        backfill = f"{result['wall_seconds']:.1f}s" if result["num_videos"] else "-"
        lines.append(
            f"| {variant} | {result['image_p50']:.2f}s | {result['image_p95']:.2f}s | "
            f"{result['images_seconds']:.1f}s | {backfill} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny-wan")
    parser.add_argument("--jobs", type=int, default=16, help="videos per burst")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--image-gap", type=float, default=0.25, help="seconds between interactive images")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the throughput variants")
    parser.add_argument("--out", type=Path, default=Path("var/bench-video"))
    parser.add_argument("--child", nargs=3, metavar=("KIND", "VARIANT", "WORKLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    options = Options(args.model, args.jobs, args.steps, args.max_num_seqs, args.threads, args.image_gap)
    if args.child:
        kind, variant, workload = args.child
        result = run_throughput(options, variant, workload) if kind == "throughput" else run_priority(options, variant)
        print(json.dumps(result))
        return 0
    command = " ".join(["python -m benchmarks.video", *(argv or sys.argv[1:])])
    return report(options, args.out, command, args.rounds)


def report(options: Options, out: Path, command: str, rounds: int = 3) -> int:
    summary = run_all(options, rounds)
    summary["command"] = command
    out.mkdir(parents=True, exist_ok=True)
    (out / "video.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "video.md").write_text(markdown(summary, command))
    print((out / "video.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
