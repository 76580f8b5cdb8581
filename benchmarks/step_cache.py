"""Step caching inside the continuous batch: images/s of uncached vs each preset, with quality beside speed.

    python -m benchmarks.step_cache [--models builtin:shapes-dit builtin:shapes] [--variants off balanced fast]
                                    [--rounds 1] [--threads 1] [--out benchmarks/results/step_cache/run1]

Per model, each variant (`cache` on every job: off, a preset, or a threshold; `serial`: uncached on an
engine that runs one job at a time, `max_num_seqs=1`) runs in a process of its own, once a round (rounds
alternate the variants' order; each figure is the median over the rounds), on the same two workloads:
- burst: 16 jobs of the fixed shapes cases (batching.shapes.accuracy) submitted at once;
- poisson: the 24 fixed cases arriving as a Poisson process (seeded: the same arrival times in every
  variant) at 3x the uncached burst's images/s, so that the queue does not drain in any variant and
  images/s measures what the engine can serve (the burst's shape, with jobs joining a running batch).
On a family that mixes sizes in a forward (builtin:shapes-dit's Z-Image) case i is drawn at 112 or 128
pixels in turn, so forwards mix sizes; on the others at 128. Figures per variant and workload: images/s
(first submit to last image) and its ratio to uncached, the fraction of block evaluations skipped
(engine stats), the pixel checker's accuracy over the 24 Poisson images, and the PSNR of each image
against the same job uncached (median, minimum). Beside wall-clock images/s, images per CPU-second of
the variant's process (every thread): on a shared machine other processes' load moves wall time, not
the work done. Where the time went: the engine's forward, decode, encode and loop-busy seconds.
With `serial` among the variants, each variant's burst images/s is also given over serial's ("x serial"),
and the checker's passes over the 16 burst images beside the 24 Poisson ones. Images (the last round's)
are kept under OUT/<model>/<variant>/ for a look.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

MIXED_SIZES = (112, 128)  # a family that mixes sizes in a forward draws case i at MIXED_SIZES[i % 2]; others 128
NUM_BURST_JOBS = 16
MAX_NUM_SEQS = 8  # every variant's engine but serial's (one job at a time)
SERIAL = "serial"
POISSON_LOAD = 3.0  # arrival rate over the uncached burst's images/s: above what the fastest variant serves
POISSON_SEED = 25


def job_params(model: str, family: str, case, index: int, cache):
    from core.params import FAMILIES, GenerationParams

    size = MIXED_SIZES[index % len(MIXED_SIZES)] if FAMILIES[family].mixes_sizes else 128
    return GenerationParams(
        prompt=case.prompt.text,
        seed=case.seed,
        guidance_scale=case.guidance_scale,
        num_inference_steps=20,
        height=size,
        width=size,
        model=model,
        cache=cache,
    )


def run_variant(args: argparse.Namespace) -> dict:
    """One variant, in this process: warm up, the burst, then the Poisson run; images saved, figures returned."""
    from batching import DiffusionEngine, EngineConfig
    from batching.shapes.accuracy import fixed_cases
    from batching.shapes.checker import check_image

    cache = "off" if args.variant == SERIAL else _cache_value(args.variant)
    cases = fixed_cases()
    folder = Path(args.images)
    folder.mkdir(parents=True, exist_ok=True)
    max_num_seqs = 1 if args.variant == SERIAL else MAX_NUM_SEQS
    config = EngineConfig(model=args.model, device="cpu", max_num_seqs=max_num_seqs, num_threads=args.threads)
    figures: dict = {"variant": args.variant}
    with DiffusionEngine(config) as engine:
        engine.submit(job_params(args.model, engine.family, cases[0], 0, cache)).result()  # warm-up, not timed
        for workload in ("burst", "poisson"):
            stats_before, cpu_before = engine.stats(), _cpu_seconds()
            before = stats_before["step_cache"].get(engine.family, {})
            if workload == "burst":
                start = time.perf_counter()
                futures = [
                    engine.submit(job_params(args.model, engine.family, cases[i], i, cache))
                    for i in range(NUM_BURST_JOBS)
                ]
            else:
                if not args.rate:  # the uncached run: POISSON_LOAD x its own burst's images/s
                    args.rate = figures["burst"]["images_per_second"] * POISSON_LOAD
                figures["poisson_rate"] = round(args.rate, 4)
                arrivals = _arrivals(len(cases), args.rate)
                start = time.perf_counter()
                futures = []
                for index, arrival in enumerate(arrivals):
                    time.sleep(max(0.0, start + arrival - time.perf_counter()))
                    futures.append(engine.submit(job_params(args.model, engine.family, cases[index], index, cache)))
            results = [future.result(timeout=1800) for future in futures]
            seconds = time.perf_counter() - start
            cpu_seconds = _cpu_seconds() - cpu_before
            stats_after = engine.stats()
            after = stats_after["step_cache"].get(engine.family, {})
            num_blocks = after.get("blocks", 0) - before.get("blocks", 0)
            num_skipped = after.get("blocks_skipped", 0) - before.get("blocks_skipped", 0)
            latencies = sorted(r.timings.get("queue_wait", 0) + r.timings.get("denoise", 0) for r in results)
            figures[workload] = {
                "jobs": len(results),
                "seconds": round(seconds, 3),
                "images_per_second": round(len(results) / seconds, 4),
                "cpu_seconds": round(cpu_seconds, 3),  # this process, every thread: the work, whatever else ran
                "images_per_cpu_second": round(len(results) / cpu_seconds, 4),
                # where the engine's time went (engine stats): forwards, decode, prompt encoding, loop iterations
                **{
                    name: round(stats_after[name] - stats_before[name], 3)
                    for name in ("forward_seconds", "decode_seconds", "encode_seconds", "busy_seconds")
                },
                "skipped_fraction": round(num_skipped / num_blocks, 4) if num_blocks else 0.0,
                "latency_p50_s": round(latencies[len(latencies) // 2], 3),
            }
            for index, result in enumerate(results):
                result.image.save(folder / f"{workload}-{index:02d}.png")
            checks = [check_image(result.image, case.prompt) for result, case in zip(results, cases)]
            figures[workload]["checker_passed"] = sum(bool(check) for check in checks)
            figures[workload]["checker_failures"] = [
                f"{case.prompt.text} (seed {case.seed}): {check.reason}"
                for case, check in zip(cases, checks)
                if not check
            ]
    return figures


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cache_value(variant: str):
    try:
        return float(variant)
    except ValueError:
        return variant


def _arrivals(num_jobs: int, rate: float) -> list[float]:
    draw = random.Random(POISSON_SEED)
    times, now = [], 0.0
    for _ in range(num_jobs):
        times.append(now)
        now += draw.expovariate(rate)
    return times


def psnr(folder_a: Path, folder_b: Path, workload: str) -> list[float]:
    import numpy as np
    from PIL import Image

    values = []
    for path_a in sorted(folder_a.glob(f"{workload}-*.png")):
        a = np.asarray(Image.open(path_a), dtype=np.float64)
        b = np.asarray(Image.open(folder_b / path_a.name), dtype=np.float64)
        error = ((a - b) ** 2).mean()
        values.append(float(10 * np.log10(255**2 / error)) if error else float("inf"))
    return values


def run_model(args: argparse.Namespace, model: str) -> dict:
    out = Path(args.out)
    model_folder = out / model.replace(":", "-").replace("/", "_")
    rounds: dict[str, list[dict]] = {variant: [] for variant in args.variants}
    rate = 0.0  # the uncached run (the first of the first round) sets it from its own burst
    for round_index in range(args.rounds):
        order = args.variants if round_index % 2 == 0 else args.variants[::-1]
        for variant in order:
            command = [sys.executable, "-m", "benchmarks.step_cache", "--variant", variant, "--model", model]
            command += ["--threads", str(args.threads), "--images", str(model_folder / variant), "--rate", str(rate)]
            print(f"{model} {variant} (round {round_index + 1}) ...", file=sys.stderr, flush=True)
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            rounds[variant].append(json.loads(output.strip().splitlines()[-1]))
            rate = rate or rounds[variant][-1]["poisson_rate"]
    runs = {variant: _median_figures(figures) for variant, figures in rounds.items()}
    baseline = runs[args.variants[0]]
    for variant, figures in runs.items():
        for workload in ("burst", "poisson"):
            for rate_name, ratio_name in (("images_per_second", "speedup"), ("images_per_cpu_second", "cpu_speedup")):
                ratio = figures[workload][rate_name] / baseline[workload][rate_name]
                figures[workload][ratio_name] = round(ratio, 3)
            if SERIAL in runs:
                ratio = figures[workload]["images_per_second"] / runs[SERIAL][workload]["images_per_second"]
                figures[workload]["over_serial"] = round(ratio, 3)
            values = sorted(psnr(model_folder / variant, model_folder / args.variants[0], workload))
            finite = [value for value in values if value != float("inf")]
            figures[workload]["psnr_median_db"] = round(values[len(values) // 2], 2) if finite else None
            figures[workload]["psnr_min_db"] = round(values[0], 2) if finite else None
    return {"model": model, "poisson_rate": rate, "rounds": args.rounds, "variants": runs}


def _median_figures(rounds: list[dict]) -> dict:
    """One variant's figures over its rounds: each number the median of its values, anything else the last
    round's."""
    figures = json.loads(json.dumps(rounds[-1]))
    for workload in ("burst", "poisson"):
        for name, value in figures[workload].items():
            if isinstance(value, (int, float)):
                values = sorted(one[workload][name] for one in rounds)
                figures[workload][name] = values[len(values) // 2]
    return figures


def table(results: list[dict]) -> str:
    lines = [
        "| model | cache | burst images/s (x) | x serial | per CPU-s (x) | Poisson images/s (x) | per CPU-s (x) "
        "| blocks skipped | checker /16 burst, /24 Poisson | PSNR median (min) dB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for variant, f in result["variants"].items():
            burst, poisson = f["burst"], f["poisson"]
            median, least = poisson["psnr_median_db"], poisson["psnr_min_db"]
            quality = "identical" if median is None else f"{median} ({least})"
            over_serial = f"{burst['over_serial']:.2f}" if "over_serial" in burst else "-"
            lines.append(
                f"| {result['model']} | {variant} "
                f"| {burst['images_per_second']:.3f} ({burst['speedup']:.2f}) | {over_serial} "
                f"| {burst['images_per_cpu_second']:.3f} ({burst['cpu_speedup']:.2f}) "
                f"| {poisson['images_per_second']:.3f} ({poisson['speedup']:.2f}) "
                f"| {poisson['images_per_cpu_second']:.3f} ({poisson['cpu_speedup']:.2f}) "
                f"| {poisson['skipped_fraction']:.0%} | {burst['checker_passed']}, {poisson['checker_passed']} "
                f"| {quality} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["builtin:shapes-dit", "builtin:shapes"])
    parser.add_argument("--variants", nargs="+", default=["off", "balanced", "fast"], help=f"and {SERIAL}")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds; figures are their medians")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/step_cache/run1")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # a child process: run this variant only
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--images", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)  # 0: from the burst
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(args)))
        return 0
    assert args.variants[0] == "off", "the first variant is the uncached baseline"
    results = [run_model(args, model) for model in args.models]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {"threads": args.threads, "rounds": args.rounds, "results": results}
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / "table.md").write_text(table(results) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
