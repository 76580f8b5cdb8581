"""The shapes models' latent-to-RGB factors for live previews, fitted on the pictures they were trained to draw.

Noise (`batching.pipelines.latent_rgb.fit_latent_rgb`'s default) is all a random-weight built-in
ever decodes; a trained model's latents are its training pictures', so these are fitted on shape
drawings encoded by the model's own VAE, plus noise for the early steps. The trainer writes the
file beside every saved model; for a folder trained before:

    python -m training.shapes.latent_rgb_fit batching/assets/builtin-shapes
    python -m training.shapes.latent_rgb_fit batching/assets/builtin-shapes-dit --model builtin:shapes-dit
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

NUM_DRAWINGS = 48
SIZE = 128


def save_latent_rgb(folder: Path, model: str = "builtin:shapes") -> None:
    import torch

    from batching.pipelines import adapter_serving
    from batching.pipelines.latent_rgb import FIT_NUM_IMAGES, encoded_latents, fit_latent_rgb
    from batching.shapes.drawing import random_example
    from batching.shapes.vocabulary import all_prompts
    from core.params import GenerationParams

    device, dtype = torch.device("cpu"), torch.float32
    adapter_class = adapter_serving(model, str(folder))
    adapter = adapter_class(model, adapter_class.load_pipeline(model, str(folder), device, dtype), device, dtype)
    rng = np.random.default_rng(0)
    prompts = all_prompts()
    drawings = [random_example(rng, prompts, SIZE)[1] for _ in range(NUM_DRAWINGS)]
    params = GenerationParams(prompt="latent rgb fit", model=model, height=SIZE, width=SIZE, seed=0)
    generator = torch.Generator("cpu").manual_seed(0)
    noise = [adapter.draw_noise(params, generator) for _ in range(FIT_NUM_IMAGES)]
    fit_latent_rgb(adapter, encoded_latents(adapter, drawings) + noise, size=SIZE).save(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fit a shapes model's latent-to-RGB preview factors")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--model", default="builtin:shapes", help="the built-in name the folder is")
    args = parser.parse_args(argv)
    save_latent_rgb(args.folder, args.model)
    print(args.folder / "latent_rgb.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
