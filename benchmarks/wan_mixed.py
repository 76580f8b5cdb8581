"""How far a Wan video co-batched with videos of other sizes and frame counts lies from itself alone, per built-in.

    python -m benchmarks.wan_mixed [--models builtin:tiny-wan builtin:tiny-wan-i2v builtin:tiny-wan22] [--threads 1]

For each model: eight jobs of four shapes (64x64x9, 96x64x5, 64x96x13 and an 80x80 image), different prompts,
seeds, steps (4-8), guidance (none included) and samplers, run one at a time on a solo engine, then submitted
together to one engine (max_num_seqs 8, one group: every shape in each forward). Prints the largest per-pixel
difference over every frame, the share of pixel values that differ at all, and the forwards' shapes and rows.
"""

from __future__ import annotations

import argparse
import base64
import io
from typing import Any

import numpy as np

SHAPES = [(64, 64, 9), (64, 96, 5), (96, 64, 13), (80, 80, 1)]  # (height, width, frames)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["builtin:tiny-wan", "builtin:tiny-wan-i2v", "builtin:tiny-wan22"]
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch
    from PIL import Image

    from batching import DiffusionEngine, EngineConfig, GenerationParams

    torch.set_num_threads(args.threads)
    for model in args.models:
        params_list = []
        for index in range(8):
            height, width, frames = SHAPES[index % len(SHAPES)]
            extra: dict[str, Any] = {}
            if "i2v" in model:
                pixels = np.random.default_rng(index).integers(0, 256, (height, width, 3), dtype=np.uint8)
                buffer = io.BytesIO()
                Image.fromarray(pixels).save(buffer, format="PNG")
                extra["init_image"] = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
            params_list.append(
                GenerationParams(
                    prompt=f"a red fox, view {index}",
                    model=model,
                    seed=100 + index,
                    num_inference_steps=4 + index % 5,
                    guidance_scale=(5.0, 1.0, 3.0, 6.0)[index % 4],
                    sampler=("unipc", "euler")[index % 2],
                    height=height,
                    width=width,
                    num_frames=frames,
                    **extra,
                )
            )
        with DiffusionEngine(EngineConfig(model=model, device="cpu", max_num_seqs=1)) as solo:
            alone = [solo.submit(params).result() for params in params_list]
        with DiffusionEngine(EngineConfig(model=model, device="cpu", max_num_seqs=8, max_num_groups=1)) as engine:
            engine.pause()
            futures = [engine.submit(params) for params in params_list]
            engine.resume()
            together = [future.result() for future in futures]
            stats = engine.stats()
        largest, differing, total = 0, 0, 0
        for result_alone, result in zip(alone, together):
            for frame_alone, frame in zip(result_alone.frames[0], result.frames[0], strict=True):
                diff = np.abs(np.asarray(frame_alone, np.int16) - np.asarray(frame, np.int16))
                largest, differing, total = (
                    max(largest, int(diff.max())),
                    differing + int((diff > 0).sum()),
                    total + diff.size,
                )
        print(
            f"{model}: largest pixel difference {largest}/255 over {sum(p.num_frames for p in params_list)} frames, "
            f"{differing / total:.4%} of pixel values differ; sizes per forward {stats['sizes_per_forward']}, "
            f"rows per forward {stats['rows_per_forward']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
