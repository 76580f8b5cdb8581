"""The part of a worker's start that only needs torch: import it, start CUDA, and read a model's weights from
disk onto the GPU (safetensors), for the fp16 sizes of real pipelines (SD 1.5 2.1 GB, SDXL 6.9 GB, FLUX.1-dev
33.5 GB with its T5), from the page cache and after dropping it (root only). Runs where diffusers is missing.

    python benchmarks/gpu/weights_to_gpu.py > weights_to_gpu.json    # on a CUDA machine, root for the cold reads

What it leaves out (`benchmarks/gpu/model_load.py` measures the whole start): building the pipeline's modules,
the engine's own start and the first job's warm-up.
"""

import json
import os
import time

started = time.perf_counter()
import torch  # noqa: E402 (its import is timed)
from safetensors.torch import load_file, save_file  # noqa: E402

SIZES_GB = {"sd15": 2.1, "sdxl": 6.9, "flux_dev": 33.5}
results = {"import_torch_s": time.perf_counter() - started}
start = time.perf_counter()
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
results["cuda_init_s"] = time.perf_counter() - start
for name, gigabytes in SIZES_GB.items():
    path = f"/tmp/{name}.safetensors"
    length = int(gigabytes * 1e9 / 2) // 64
    start = time.perf_counter()
    save_file({f"t{i}": torch.empty(length, dtype=torch.float16) for i in range(64)}, path)
    results[f"{name}_write_s"] = time.perf_counter() - start
    for mode in ("page_cache", "cold"):
        if mode == "cold":
            os.sync()
            try:
                with open("/proc/sys/vm/drop_caches", "w") as caches:
                    caches.write("3\n")
                results["dropped"] = True
            except OSError:
                results["dropped"] = False
        start = time.perf_counter()
        weights = load_file(path, device="cuda")
        torch.cuda.synchronize()
        results[f"{name}_{mode}_to_gpu_s"] = time.perf_counter() - start
        del weights
        torch.cuda.empty_cache()
    os.remove(path)
print(json.dumps(results, indent=2))
