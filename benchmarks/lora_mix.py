"""Many adapters: 16 jobs over 4 LoRA adapters plus none, interleaved, submitted at once.

    python -m benchmarks.lora_mix [--model builtin:tiny] [--jobs 16] [--steps 20] [--threads 1]

Variants, each in its own process (torch threads of two variants in one process slow each other):
- rows: the default; rows with different adapters and none share each forward (`lora_mode="rows"`).
- group: one adapter per group, the reference behaviour (`lora_mode="group"`; the default policy still
  runs up to `max_num_groups` groups per iteration, one forward each).
- serial: one job at a time (`max_num_seqs=1`).
Each process first runs one job per adapter (loads them, warms up), then times the burst from the
first submit to the last image. Random-weight adapters from `benchmarks.random_loras`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ADAPTERS = ("mix-a", "mix-b", "mix-c", "mix-d")
VARIANTS: dict[str, dict[str, Any]] = {
    "rows": {"lora_mode": "rows", "max_num_seqs": 8},
    "group": {"lora_mode": "group", "max_num_seqs": 8},
    "serial": {"lora_mode": "rows", "max_num_seqs": 1},
}


def workload(num_jobs: int, steps: int, model: str) -> list:
    from batching import GenerationParams

    choices = (*ADAPTERS, None)
    return [
        GenerationParams(
            prompt=f"a picture number {index}",
            seed=index,
            num_inference_steps=steps,
            model=model,
            lora=choices[index % len(choices)],
            lora_scale=0.5 + 0.25 * (index % 3),
        )
        for index in range(num_jobs)
    ]


def run_variant(name: str, store: str, args: argparse.Namespace) -> dict:
    from batching import DiffusionEngine, EngineConfig, GenerationParams

    config = EngineConfig(model=args.model, device="cpu", lora_url=store, num_threads=args.threads, **VARIANTS[name])
    with DiffusionEngine(config) as engine:
        for adapter in ADAPTERS:  # load every adapter and warm up
            engine.submit(
                GenerationParams(prompt="warm up", seed=0, num_inference_steps=2, model=args.model, lora=adapter)
            ).result()
        forwards_before = engine.stats()["forwards"]
        start = time.perf_counter()
        futures = [engine.submit(params) for params in workload(args.jobs, args.steps, args.model)]
        for future in futures:
            future.result()
        seconds = time.perf_counter() - start
        stats = engine.stats()
    return {
        "variant": name,
        "seconds": seconds,
        "images_per_second": args.jobs / seconds,
        "forwards": stats["forwards"] - forwards_before,
        "loras_per_forward": stats["loras_per_forward"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # one variant, in a child process
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.store, args)))
        return 0

    from benchmarks.random_loras import make_lora

    with tempfile.TemporaryDirectory() as folder:
        for seed, adapter in enumerate(ADAPTERS):
            make_lora(args.model, Path(folder) / f"{adapter}.safetensors", seed=seed)
        results = {}
        for name in VARIANTS:
            child = [
                sys.executable,
                "-m",
                "benchmarks.lora_mix",
                "--variant",
                name,
                "--store",
                Path(folder).as_uri(),
                "--model",
                args.model,
                "--jobs",
                str(args.jobs),
                "--steps",
                str(args.steps),
                "--threads",
                str(args.threads),
            ]
            completed = subprocess.run(child, capture_output=True, text=True, check=True)
            results[name] = json.loads(completed.stdout.strip().splitlines()[-1])
    print(
        f"{args.jobs} jobs over {len(ADAPTERS)} adapters + none, {args.steps} steps, {args.model}, "
        f"{args.threads} torch thread(s)"
    )
    print(f"{'variant':<8} {'seconds':>8} {'img/s':>7} {'forwards':>9}  adapters per forward -> forwards")
    for result in results.values():
        print(
            f"{result['variant']:<8} {result['seconds']:8.2f} {result['images_per_second']:7.2f} "
            f"{result['forwards']:9d}  {result['loras_per_forward']}"
        )
    rows = results["rows"]["seconds"]
    print(
        f"rows vs group: {results['group']['seconds'] / rows:.2f}x   rows vs serial: "
        f"{results['serial']['seconds'] / rows:.2f}x   group vs serial: "
        f"{results['serial']['seconds'] / results['group']['seconds']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
