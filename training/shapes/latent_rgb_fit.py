"""The shapes models' latent-to-RGB maps for live previews, fitted on the pictures they were trained to draw.

Noise (`batching.pipelines.latent_rgb.fit_latent_rgb`'s default) is all a random-weight built-in
ever decodes; a trained model's latents are its training pictures', so these are fitted on shape
drawings encoded by the model's own VAE, plus noise for the early steps. The shapes VAE's colours
are not linear in its latents (a linear fit previews blue as navy and white as yellow), so the map
has a hidden layer of `NUM_UNITS` (`batching.pipelines.latent_rgb.HiddenLayer`), trained here with
Adam on every latent position's decoded colour: seeded, on the CPU, about 20 s. The trainer writes
the file beside every saved model; to refit a folder (the shipped ones included), run

    python -m training.shapes.latent_rgb_fit batching/assets/builtin-shapes
    python -m training.shapes.latent_rgb_fit batching/assets/builtin-shapes-dit --model builtin:shapes-dit

and it prints each palette colour as the new map previews it (drawn flat, encoded, mapped).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

if TYPE_CHECKING:
    import torch

    from batching.pipelines.contract import PipelineAdapter
    from batching.pipelines.latent_rgb import LatentRgb

NUM_DRAWINGS = 48
SIZE = 128
NUM_UNITS = 16  # the hidden layer's: 8 did worse on white and blue, 32 no better than 16
NUM_ITERATIONS = 3000  # full-batch Adam steps on the (about 14,000) latent positions
LEARNING_RATE = 1e-2


def save_latent_rgb(folder: Path, model: str = "builtin:shapes") -> LatentRgb:
    import torch

    from batching.pipelines import adapter_serving
    from batching.pipelines.latent_rgb import FIT_NUM_IMAGES, encoded_latents, fit_samples
    from batching.shapes.drawing import random_example
    from core.params import GenerationParams
    from core.shapes_vocabulary import all_prompts

    device, dtype = torch.device("cpu"), torch.float32
    adapter_class = adapter_serving(model, str(folder))
    adapter = adapter_class(model, adapter_class.load_pipeline(model, str(folder), device, dtype), device, dtype)
    rng = np.random.default_rng(0)
    prompts = all_prompts()
    drawings = [random_example(rng, prompts, SIZE)[1] for _ in range(NUM_DRAWINGS)]
    params = GenerationParams(prompt="latent rgb fit", model=model, height=SIZE, width=SIZE, seed=0)
    generator = torch.Generator("cpu").manual_seed(0)
    noise = [adapter.draw_noise(params, generator) for _ in range(FIT_NUM_IMAGES)]
    x, y = fit_samples(adapter, encoded_latents(adapter, drawings) + noise, size=SIZE)
    fitted = fit_hidden_layer(x, y)
    fitted.save(folder)
    for name, shown in palette_as_previewed(adapter, fitted).items():
        print(f"{name:>7}: drawn {shown[0]}, previewed {shown[1]}")
    return fitted


def fit_hidden_layer(x: torch.Tensor, y: torch.Tensor, num_units: int = NUM_UNITS) -> LatentRgb:
    """A map with one hidden layer from latent channels `x` [n, c] to colours `y` [n, 3] (mean squared error)."""
    import torch

    from batching.pipelines.latent_rgb import LatentRgb

    torch.manual_seed(0)
    x, y = x.clone(), y.clone()  # out of the fit's inference mode, so autograd may use them
    with torch.enable_grad():
        layers = torch.nn.Sequential(
            torch.nn.Linear(x.shape[1], num_units), torch.nn.SiLU(), torch.nn.Linear(num_units, 3)
        ).double()
        optimizer = torch.optim.Adam(layers.parameters(), LEARNING_RATE)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, NUM_ITERATIONS)
        for _ in range(NUM_ITERATIONS):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(layers(x), y).backward()
            optimizer.step()
            schedule.step()
    hidden, out = cast("torch.nn.Linear", layers[0]), cast("torch.nn.Linear", layers[2])
    return LatentRgb.from_tensors(
        out.weight.detach().T.float(),
        out.bias.detach().float(),
        "fitted",
        (hidden.weight.detach().T, hidden.bias.detach()),
    )


def palette_as_previewed(adapter: PipelineAdapter, fitted: LatentRgb) -> dict[str, tuple[tuple, tuple]]:
    """Each palette colour: (as drawn, as the map previews a flat picture of it) in 0-255."""
    from PIL import Image

    from batching.pipelines.latent_rgb import encoded_latents
    from core.params import GenerationParams
    from core.shapes_vocabulary import COLOURS

    params = GenerationParams(prompt="latent rgb fit", model=adapter.model, height=SIZE, width=SIZE, seed=0)
    to_rgb = fitted.on(adapter.device)
    flat = encoded_latents(adapter, [Image.new("RGB", (SIZE, SIZE), rgb) for rgb in COLOURS.values()])
    shown = {}
    for (name, rgb), latents in zip(COLOURS.items(), flat, strict=True):
        mean = to_rgb(adapter.preview_latents(latents, params)).mean((0, 1))  # [3]
        shown[name] = (rgb, tuple(int(v) for v in ((mean + 1) * 127.5).clamp(0, 255).round().tolist()))
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fit a shapes model's latent-to-RGB preview map")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--model", default="builtin:shapes", help="the built-in name the folder is")
    args = parser.parse_args(argv)
    save_latent_rgb(args.folder, args.model)
    print(args.folder / "latent_rgb.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
