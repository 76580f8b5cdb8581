"""One denoiser forward with rows of 4 LoRA adapters plus none: stepwise's per-row deltas vs PEFT's
mixed-batch `adapter_names` path, same weights, same rows (every scale 1: PEFT keeps one scale per adapter).

    python -m benchmarks.lora_forward [--model builtin:tiny] [--rows 16] [--repeats 20] [--threads 1]

Prints the median forward time of each path (interleaved repeats) and their largest output difference.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

ADAPTERS = ("mix-a", "mix-b", "mix-c", "mix-d")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    from batching.lora.engine_loras import EngineLoras
    from batching.lora.row_deltas import is_lora_layer
    from batching.lora.store import LoraSource
    from batching.model_loading import load_model
    from benchmarks.random_loras import make_lora

    torch.set_num_threads(args.threads)
    model = load_model(args.model, "cpu", "float32")
    unet = model.pipeline.unet
    with tempfile.TemporaryDirectory() as folder:
        for seed, name in enumerate(ADAPTERS):
            make_lora(args.model, Path(folder) / f"{name}.safetensors", seed=seed)
        loras = EngineLoras(
            LoraSource(Path(folder).as_uri()), model.pipeline, model.device, max_adapters=8, max_bytes=2**30
        )
        for name in ADAPTERS:
            loras.fetch(name)
            loras.prepare(name, in_use=())
    choices = (*ADAPTERS, None)
    row_adapters = [(choices[row % len(choices)], 1.0) for row in range(args.rows)]
    peft_names = [loras.cache.internal_name(name) if name else "__base__" for name, _ in row_adapters]
    size = 128 // model.pipeline.vae_scale_factor
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(args.rows, unet.config.in_channels, size, size, generator=generator)
    timesteps = torch.linspace(900, 100, args.rows)
    embeds = torch.randn(args.rows, 77, unet.config.cross_attention_dim, generator=generator)
    layers = [layer for layer in unet.modules() if is_lora_layer(layer)]

    def rows_forward() -> torch.Tensor:
        with loras.rows(row_adapters):
            return unet(latents, timesteps, encoder_hidden_states=embeds, return_dict=False)[0]

    def peft_forward() -> torch.Tensor:
        handles = [
            layer.register_forward_pre_hook(lambda m, a, kw: (a, {**kw, "adapter_names": peft_names}), with_kwargs=True)
            for layer in layers
        ]
        for layer in layers:
            layer.enable_adapters(True)
        try:
            return unet(latents, timesteps, encoder_hidden_states=embeds, return_dict=False)[0]
        finally:
            for layer in layers:
                layer.enable_adapters(False)
            for handle in handles:
                handle.remove()

    def base_forward() -> torch.Tensor:
        return unet(latents, timesteps, encoder_hidden_states=embeds, return_dict=False)[0]

    paths = {
        "base (no adapters)": base_forward,
        "stepwise per-row deltas": rows_forward,
        "PEFT adapter_names": peft_forward,
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    outputs = {}
    with torch.inference_mode():
        for name, forward in paths.items():
            outputs[name] = forward()  # warm up
        for _ in range(args.repeats):
            for name, forward in paths.items():
                start = time.perf_counter()
                forward()
                times[name].append(time.perf_counter() - start)
    print(
        f"{args.model}, {args.rows} rows over {len(ADAPTERS)} adapters + none, {args.threads} thread(s), "
        f"median of {args.repeats}"
    )
    for name, samples in times.items():
        print(f"{name:<26} {statistics.median(samples) * 1000:8.1f} ms")
    difference = (outputs["stepwise per-row deltas"] - outputs["PEFT adapter_names"]).abs().max().item()
    print(f"largest difference, per-row deltas vs PEFT: {difference:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
