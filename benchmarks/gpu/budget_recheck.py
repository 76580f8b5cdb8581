"""The GPU suite's SD 1.5 throughput section alone: serial, static and default on a 16-job burst and Poisson
arrivals at real size (512x512, 20 steps, max_num_seqs 8), for re-measuring the engine's default token budget on
a GPU in a short device run. The first run (benchmarks/results/gpu/run1) found the default engine at one job per
forward there; the budget now holds max_num_seqs samples at the loaded model's native size.

    benchmarks/gpu/budget_recheck.py OUT_DIR          # on the GPU machine (installs carried wheels as run.sh does)
    python -m benchmarks.gpu.budget_recheck --dry-run OUT_DIR   # tiny sizes on the CPU
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.gpu.models import save_pipeline
from benchmarks.gpu.suite import PROFILES, _Engines, throughput
from benchmarks.machine import describe_machine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    args = parser.parse_args(argv)
    profile = PROFILES["dry-run" if args.dry_run else "gpu"]
    model_run = profile.models[0]  # sd15
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stepwise-gpu-recheck-") as scratch:
        folder = save_pipeline(
            model_run.name,
            profile.scale,
            Path(scratch) / model_run.name,
            torch.device(profile.device),
            getattr(torch, profile.dtype),
        )
        engines = _Engines(profile, str(folder), model_run)
        try:
            figures = throughput(engines, str(folder), model_run)
            stats = engines.get("default").opened_engine.stats()
        finally:
            engines.close()
    result = {
        "run": asdict(model_run),
        "machine": describe_machine(profile.device, torch.get_num_threads()),
        "throughput": figures,
        "default_engine_stats": {key: stats.get(key) for key in ("jobs_per_forward", "forwards")},
        "seconds": time.perf_counter() - started,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "budget_recheck.json").write_text(json.dumps(result, indent=2, default=str))
    for kind in ("burst", "poisson"):
        rates = {name: figures[kind][name]["throughput_images_per_second"] for name in ("serial", "static", "default")}
        default = rates["default"]
        ratios = f"default/serial {default / rates['serial']:.2f}x, default/static {default / rates['static']:.2f}x"
        print(kind, {name: round(rate, 3) for name, rate in rates.items()}, ratios)
    print("default engine:", result["default_engine_stats"], f"in {result['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
