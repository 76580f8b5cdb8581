"""How long a new worker takes from its start to its first image with a real-sized model: what a job waits
when an autoscaler starts the first worker of a model that had none (docs/scaling.md).

    python -m benchmarks.gpu.model_load [--out DIR]          # on a CUDA machine, with benchmarks/gpu/run.sh's wheels
    python -m benchmarks.gpu.model_load --dry-run --out DIR  # tiny sizes on the CPU

For the SD-1.5-sized and SDXL-sized pipelines of `benchmarks.gpu.models` (random weights with the real
models' structure, fp16, saved to local disk), each in a fresh Python process, as a starting worker does:
import the engine (torch, diffusers), build it (the folder loaded onto the device), run a first job (CUDA
kernels and the allocator warm up) and a second one. Each model is timed twice: reading the folder from the
page cache (it was just saved), and after asking the kernel to drop its caches (root on the GPU machine
only, never in a dry run; the result says whether it could). A pod reading its model from a network volume
adds that volume's read time for the folder's bytes, which `folder_bytes` gives. Writes model_load.json to the folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = {"sd15": 512, "sdxl": 1024}  # model -> image size of its jobs
NUM_STEPS = 20

CHILD = """
import json, sys, time
started = time.perf_counter()
from batching import DiffusionEngine, EngineConfig, GenerationParams
imported = time.perf_counter()
folder, device, size, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
engine = DiffusionEngine(EngineConfig(model=folder, device=device, max_num_seqs=1))
loaded = time.perf_counter()
params = dict(prompt="a red fox", seed=1, num_inference_steps=steps, height=size, width=size, model=folder)
engine.submit(GenerationParams(**params)).result()
first = time.perf_counter()
engine.submit(GenerationParams(**{**params, "seed": 2})).result()
second = time.perf_counter()
engine.shutdown()
print(json.dumps({"import_seconds": imported - started, "load_seconds": loaded - imported,
                  "first_job_seconds": first - loaded, "second_job_seconds": second - first,
                  "to_first_image_seconds": first - started}))
"""


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def time_worker_start(folder: Path, device: str, size: int, steps: int) -> dict:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), device, str(size), str(steps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the worker stand-in failed:\n{result.stderr[-3000:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["process_seconds"] = time.perf_counter() - started  # with the interpreter's own start
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "benchmarks/results/gpu"))
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    args = parser.parse_args(argv)

    import torch

    from benchmarks.gpu.models import save_pipeline
    from benchmarks.machine import describe_machine

    device, dtype, scale = ("cpu", torch.float32, "tiny") if args.dry_run else ("cuda", torch.float16, "real")
    runs = {name: 64 for name in RUNS} if args.dry_run else RUNS
    steps = 2 if args.dry_run else NUM_STEPS
    results: dict = {"machine": describe_machine(device, torch.get_num_threads()), "num_steps": steps, "models": {}}
    with tempfile.TemporaryDirectory(prefix="stepwise-model-load-") as scratch:
        for name, size in runs.items():
            folder = save_pipeline(name, scale, Path(scratch) / name, torch.device(device), dtype)
            entry: dict = {
                "size": size,
                "folder_bytes": sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()),
            }
            entry["page_cache"] = time_worker_start(folder, device, size, steps)
            entry["cold_cache_dropped"] = not args.dry_run and drop_page_cache()  # never on a shared dev machine
            entry["cold"] = time_worker_start(folder, device, size, steps)
            results["models"][name] = entry
            print(name, json.dumps(entry), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "model_load.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
