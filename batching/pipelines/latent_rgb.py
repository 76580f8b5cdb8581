"""A linear map from a family's latent channels to RGB: what a live preview is made of, without the VAE.

A preview is `rgb = factors^T @ latent + bias` at every position of the latent grid (each
adapter's `preview_latents` lays a sample's latents out as that grid), in [-1, 1] as the VAE's
pixels are. A VAE whose colours are not linear in its latents (the shapes models' small one puts
blue in a curve of two channels: a linear map shows a blue square on white as navy on yellow) gets
one small hidden layer first, `silu(weights^T @ latent + bias)`, and the factors map its units.
Where the factors come from, in this order (`latent_rgb_for`, at load):

1. the model folder's `latent_rgb.json`: the built-ins write one when they are built, fitted by
   least squares against their own VAE (`fit_latent_rgb`); the trained shapes models' files hold a
   hidden layer (training/shapes/latent_rgb_fit.py fits them on their own pictures);
2. a built-in folder without one (built before previews existed): fitted at load and saved there;
3. the family's published factors (the adapter's `published_latent_rgb`: the community's fits for
   the real SD 1.x, SDXL, SD3, FLUX.1, Qwen-Image and FLUX.2 latent spaces, as ComfyUI ships them);
4. none: the model makes no previews.
"""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from core.families import FAMILIES
from core.params import GenerationParams

if TYPE_CHECKING:
    from batching.pipelines.contract import PipelineAdapter

logger = logging.getLogger(__name__)

FILE_NAME = "latent_rgb.json"
FIT_SIZE = 128  # pixels a side of the images the fit decodes
FIT_NUM_IMAGES = 8
FIT_RIDGE = 1e-3  # keeps a fit with many channels (FLUX.2's 128) well posed on few positions


@dataclass(frozen=True)
class HiddenLayer:
    """`silu(weights^T @ latent + bias)` at each position: what the factors map when colours are not linear."""

    weights: tuple[tuple[float, ...], ...]  # one row of num_units values per channel of `preview_latents`
    bias: tuple[float, ...]  # num_units values

    @property
    def num_units(self) -> int:
        return len(self.bias)


@dataclass(frozen=True)
class LatentRgb:
    factors: tuple[tuple[float, float, float], ...]  # one (r, g, b) row per channel (per hidden unit with `hidden`)
    bias: tuple[float, float, float] = (0.0, 0.0, 0.0)
    source: str = "published"  # published, or fitted (against the model's own VAE)
    hidden: HiddenLayer | None = None  # None: the factors map the latent channels themselves

    @property
    def num_channels(self) -> int:
        return len(self.hidden.weights) if self.hidden else len(self.factors)

    def on(self, device: torch.device) -> LatentRgbMap:
        """The map as float32 tensors on `device`, ready for a latent grid."""
        return LatentRgbMap(self, device)

    def save(self, folder: Path) -> None:
        def lines(rows: Sequence[Sequence[float]]) -> str:  # one channel a line
            return "[\n  " + ",\n  ".join(json.dumps(list(row)) for row in rows) + "\n ]"

        text = f'{{"source": "{self.source}", "bias": {json.dumps(list(self.bias))},\n "factors": {lines(self.factors)}'
        if self.hidden is not None:
            text += f',\n "hidden_bias": {json.dumps(list(self.hidden.bias))},\n "hidden_weights": '
            text += lines(self.hidden.weights)
        (Path(folder) / FILE_NAME).write_text(text + "}\n")

    @classmethod
    def load(cls, path: Path) -> LatentRgb:
        body = json.loads(Path(path).read_text())
        factors = tuple((float(r), float(g), float(b)) for r, g, b in body["factors"])
        r, g, b = body.get("bias", (0.0, 0.0, 0.0))
        hidden = None
        if "hidden_weights" in body:
            weights = tuple(tuple(float(value) for value in row) for row in body["hidden_weights"])
            hidden = HiddenLayer(weights, tuple(float(value) for value in body["hidden_bias"]))
        return cls(factors, (float(r), float(g), float(b)), str(body.get("source", "fitted")), hidden)

    @classmethod
    def from_tensors(
        cls,
        factors: torch.Tensor,
        bias: torch.Tensor,
        source: str,
        hidden: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> LatentRgb:
        """From factors [c or units, 3], bias [3] and a hidden layer's (weights [c, units], bias [units])."""

        def rounded(values: list[float]) -> tuple[float, ...]:
            return tuple(round(value, 5) for value in values)

        rows = tuple(rounded(row) for row in factors.tolist())
        layer = (
            HiddenLayer(tuple(rounded(row) for row in hidden[0].tolist()), rounded(hidden[1].tolist()))
            if hidden
            else None
        )
        return cls(rows, rounded(bias.tolist()), source, layer)  # type: ignore[arg-type]  # rows of three

    def expanded(self, repeats: int) -> LatentRgb:
        """Each row `repeats` times, divided by `repeats`: the factors of channels patchified into `repeats`
        sub-positions (channel c * repeats + p), averaging the sub-positions (FLUX.2's 2x2 patches)."""
        assert self.hidden is None, "published factors are linear"
        rows = tuple(tuple(value / repeats for value in row) for row in self.factors for _ in range(repeats))
        return LatentRgb(rows, self.bias, self.source)  # type: ignore[arg-type]  # rows of three


class LatentRgbMap:
    """A `LatentRgb` as tensors on a device: a latent grid [c, h, w] to RGB [h, w, 3] in about [-1, 1]."""

    def __init__(self, latent_rgb: LatentRgb, device: torch.device) -> None:
        def tensor(values: Any) -> torch.Tensor:
            return torch.tensor(values, device=device, dtype=torch.float32)

        self.factors, self.bias = tensor(latent_rgb.factors), tensor(latent_rgb.bias)  # [c or units, 3], [3]
        hidden = latent_rgb.hidden
        self.hidden = (tensor(hidden.weights), tensor(hidden.bias)) if hidden else None  # [c, units], [units]

    def __call__(self, grid: torch.Tensor) -> torch.Tensor:
        features = grid.float().permute(1, 2, 0)  # [h, w, c]
        if self.hidden is not None:
            weights, bias = self.hidden
            features = torch.nn.functional.silu(features @ weights + bias)  # [h, w, units]
        return features @ self.factors + self.bias  # [h, w, 3]


def latent_rgb_for(adapter: PipelineAdapter, source: str) -> LatentRgb | None:
    """The factors of a model just loaded from `source` (its folder, or a cached repo id's), as the module
    docstring orders them."""
    from core.builtin_models import is_builtin

    folder = Path(source)
    path = folder / FILE_NAME
    if path.is_file():
        return LatentRgb.load(path)
    if is_builtin(adapter.model):
        fitted = fit_latent_rgb(adapter)
        try:
            fitted.save(folder)
        except OSError as e:  # a read-only folder: fitted again at the next load
            logger.info("could not save %s's latent-to-RGB factors in %s: %s", adapter.model, folder, e)
        return fitted
    return getattr(adapter, "published_latent_rgb", None)


def fit_latent_rgb(
    adapter: PipelineAdapter, latents: Sequence[torch.Tensor] | None = None, *, size: int = FIT_SIZE
) -> LatentRgb:
    """Least-squares factors from `latents` (each [1, *latent_shape] of a `size` x `size` image, in the
    denoiser's space; standard normal noise, the denoiser's own prior, unless given) to the pixels the
    model's VAE decodes from them, averaged over each latent position's patch of pixels."""
    x, y = fit_samples(adapter, latents, size=size)
    x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)  # the bias column
    ridge = FIT_RIDGE * len(x) * torch.eye(x.shape[1], dtype=x.dtype)
    ridge[-1, -1] = 0  # the bias is not shrunk
    solution = torch.linalg.solve(x.T @ x + ridge, x.T @ y)  # [c + 1, 3]
    return LatentRgb.from_tensors(solution[:-1].float(), solution[-1].float(), "fitted")


@torch.inference_mode()
def fit_samples(
    adapter: PipelineAdapter, latents: Sequence[torch.Tensor] | None = None, *, size: int = FIT_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """What a fit learns from, as `fit_latent_rgb` describes it: (latent channels [n, c], their decoded colours
    [n, 3] in [-1, 1]), one row per latent position, in float64."""
    params = GenerationParams(
        prompt="latent rgb fit",
        model=adapter.model,
        height=size,
        width=size,
        seed=0,
        init_image=_edit_image(adapter, size),
        num_frames=1,  # a video family's first latent frame decodes to its first frame alone (causal VAEs)
    )
    if latents is None:
        generator = torch.Generator("cpu").manual_seed(0)
        latents = [adapter.draw_noise(params, generator) for _ in range(FIT_NUM_IMAGES)]
    inputs, targets = [], []
    for one in latents:
        grid = adapter.preview_latents(one, params).float()  # [c, h, w]
        image = adapter.decode(one, [params])[0]
        pixels = torch.as_tensor(_array(image), dtype=torch.float32).permute(2, 0, 1) / 127.5 - 1  # [3, H, W]
        pooled = torch.nn.functional.adaptive_avg_pool2d(pixels[None], (grid.shape[-2], grid.shape[-1]))[0]  # [3, h, w]
        inputs.append(grid.flatten(1).T.cpu())  # [h*w, c]
        targets.append(pooled.flatten(1).T)  # [h*w, 3]
    return torch.cat(inputs).double(), torch.cat(targets).double()


def _edit_image(adapter: PipelineAdapter, size: int) -> str | None:
    """A grey picture for a family whose jobs must name the image they edit (Qwen-Image-Edit); None for others.
    The fit reads only the noise latents and their decode, never the image."""
    family = getattr(adapter, "family", None)  # a stand-in adapter (a test's linear VAE) may name none
    if family is None or FAMILIES[family].init_image_role != "edit":
        return None
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (128, 128, 128)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@torch.inference_mode()
def encoded_latents(adapter: PipelineAdapter, images: Sequence[Any]) -> list[torch.Tensor]:
    """RGB images (PIL, one size) as the denoiser-space latents [1, *latent_shape] their VAE encodes them to:
    fit data from a trained model's own kind of pictures."""
    generator = torch.Generator("cpu").manual_seed(0)
    latents = []
    for image in images:
        pixels = torch.as_tensor(_array(image), dtype=torch.float32).permute(2, 0, 1)[None] / 127.5 - 1
        mean, std = adapter.encode_images(pixels.to(adapter.device, adapter.dtype))
        latents.append(adapter.image_latents(mean, std, generator))
    return latents


def _array(image: Any) -> Any:
    import numpy as np

    return np.array(image.convert("RGB"))
