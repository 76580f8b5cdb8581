"""Which early feature, and which thresholds: quality against block evaluations, per threshold.

    python -m benchmarks.step_cache_sweep --model builtin:shapes-dit [--feature modulated_input first_block]
                                          [--thresholds 0.1 0.15 0.2 0.25 0.3] [--jobs 16]

The first `--jobs` fixed shapes cases (batching.shapes.accuracy) run co-batched uncached, then at each
threshold; per threshold: the fraction of main-block evaluations that ran (what a skip saves, counted,
not timed: the figures do not depend on the machine's load), the PSNR of each image against the same
job uncached (median, minimum) and the pixel checker's passes. On Z-Image, `--feature` compares
TeaCache's feature (the first main block's modulated input: a skip saves every main block) with
First-Block Cache's (block 0's residual: block 0 runs on every row, a skip saves the others).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks.step_cache import MIXED_SIZES

KEPT_BLOCKS = {"modulated_input": 0, "first_block": 1}  # Z-Image: main blocks every row runs


def sweep(model: str, feature: str | None, thresholds: list[float], num_jobs: int, threads: int) -> list[dict]:
    from batching import DiffusionEngine, EngineConfig
    from batching.shapes.accuracy import fixed_cases
    from batching.shapes.checker import check_image
    from core.params import FAMILIES, GenerationParams

    if feature is not None:
        import batching.pipelines.zimage.step_cache as zimage_step_cache

        zimage_step_cache.NUM_BLOCKS_KEPT = KEPT_BLOCKS[feature]
    cases = fixed_cases()[:num_jobs]
    rows = []
    with DiffusionEngine(EngineConfig(model=model, device="cpu", max_num_seqs=8, num_threads=threads)) as engine:
        if feature is not None:
            engine.model_runner.step_caching.num_blocks_kept = KEPT_BLOCKS[feature]  # type: ignore[union-attr]
        sizes = MIXED_SIZES if FAMILIES[engine.family].mixes_sizes else (128,)  # as benchmarks.step_cache draws them

        def run(cache) -> list[np.ndarray]:
            futures = [
                engine.submit(
                    GenerationParams(
                        prompt=case.prompt.text,
                        seed=case.seed,
                        guidance_scale=case.guidance_scale,
                        num_inference_steps=20,
                        height=sizes[index % len(sizes)],
                        width=sizes[index % len(sizes)],
                        model=model,
                        cache=cache,
                    )
                )
                for index, case in enumerate(cases)
            ]
            return [future.result(timeout=1800).image for future in futures]

        def passes(images) -> int:
            return sum(bool(check_image(image, case.prompt)) for image, case in zip(images, cases))

        uncached = run("off")
        rows.append({"threshold": "off", "blocks_run": 1.0, "checker_passed": passes(uncached)})
        for threshold in thresholds:
            before = engine.stats()["step_cache"][engine.family]
            images = run(threshold)
            after = engine.stats()["step_cache"][engine.family]
            skipped = (after["blocks_skipped"] - before["blocks_skipped"]) / (after["blocks"] - before["blocks"])
            values = sorted(_psnr(a, b) for a, b in zip(uncached, images))
            rows.append(
                {
                    "threshold": threshold,
                    "blocks_run": round(1 - skipped, 3),
                    "psnr_median_db": round(values[len(values) // 2], 2),
                    "psnr_min_db": round(values[0], 2),
                    "checker_passed": passes(images),
                }
            )
            print(json.dumps({"feature": feature, **rows[-1]}), flush=True)
    return rows


def _psnr(image_a, image_b) -> float:
    a, b = np.asarray(image_a, dtype=np.float64), np.asarray(image_b, dtype=np.float64)
    error = ((a - b) ** 2).mean()
    return float(10 * np.log10(255**2 / error)) if error else 99.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin:shapes-dit")
    parser.add_argument("--feature", nargs="*", default=[], choices=sorted(KEPT_BLOCKS), help="Z-Image only")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.1, 0.15, 0.2, 0.25, 0.3])
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    results = {
        str(feature): sweep(args.model, feature, args.thresholds, args.jobs, args.threads)
        for feature in (args.feature or [None])
    }
    for feature, rows in results.items():
        print(f"\n{args.model}, feature {feature}:")
        print("| threshold | main blocks run | PSNR median (min) dB | checker |")
        print("|---|---|---|---|")
        for row in rows:
            quality = f"{row['psnr_median_db']} ({row['psnr_min_db']})" if "psnr_median_db" in row else "-"
            print(f"| {row['threshold']} | {row['blocks_run']:.0%} | {quality} | {row['checker_passed']}/{args.jobs} |")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"model": args.model, "jobs": args.jobs, "results": results}, file, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
