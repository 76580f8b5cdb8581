"""Quick check that step-level batching pays: N concurrent jobs, batched vs max_num_seqs=1.

    python -m benchmarks.engine_quick [--model builtin:tiny] [--jobs 8] [--steps 20] [--size 128] [--threads N]

Both engines run in this process, one after the other, on the same jobs (guided, mixed
samplers). Prints rows per forward and images/s for each and the throughput ratio.
"""

from __future__ import annotations

import argparse
import time

from batching import DiffusionEngine, EngineConfig, GenerationParams
from core.families import UNET_SAMPLERS


def run(config: EngineConfig, params_list: list[GenerationParams]) -> dict:
    with DiffusionEngine(config) as engine:
        engine.submit(params_list[0]).result()  # warm-up, not timed
        before = engine.stats()
        start = time.perf_counter()
        for future in [engine.submit(params) for params in params_list]:
            future.result()
        seconds = time.perf_counter() - start
        after = engine.stats()
    num_forwards = after["forwards"] - before["forwards"]
    num_rows = sum(rows * count for rows, count in after["rows_per_forward"].items()) - sum(
        rows * count for rows, count in before["rows_per_forward"].items()
    )
    return {
        "seconds": seconds,
        "images_per_second": len(params_list) / seconds,
        "forwards": num_forwards,
        "rows_per_forward": num_rows / num_forwards,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    params_list = [
        GenerationParams(
            prompt=f"a red fox, picture {i}",
            seed=i,
            model=args.model,
            num_inference_steps=args.steps,
            height=args.size,
            width=args.size,
            sampler=UNET_SAMPLERS[i % len(UNET_SAMPLERS)],
        )
        for i in range(args.jobs)
    ]
    results = {}
    for name, max_num_seqs in (("batched", args.jobs), ("max_num_seqs=1", 1)):
        config = EngineConfig(model=args.model, device=args.device, max_num_seqs=max_num_seqs, num_threads=args.threads)
        results[name] = run(config, params_list)
    print(f"{args.jobs} concurrent jobs, {args.steps} steps, {args.size}x{args.size}, {args.model}")
    for name, result in results.items():
        print(
            f"  {name:>15}: {result['images_per_second']:6.2f} images/s"
            f"  {result['rows_per_forward']:5.1f} rows/forward  {result['forwards']:4d} forwards"
            f"  {result['seconds']:6.2f} s"
        )
    ratio = results["batched"]["images_per_second"] / results["max_num_seqs=1"]["images_per_second"]
    print(f"  throughput ratio batched / max_num_seqs=1: {ratio:.2f}x")


if __name__ == "__main__":
    main()
