"""Pipeline adapters: one module per model family, each implementing `contract.PipelineAdapter`."""

from __future__ import annotations

import torch

from batching.pipelines.contract import PipelineAdapter
from batching.pipelines.flux import FluxAdapter
from batching.pipelines.loading import detect_family, model_source
from batching.pipelines.sdxl import StableDiffusionXLAdapter
from batching.pipelines.stable_diffusion import StableDiffusionAdapter
from batching.pipelines.zimage import ZImageAdapter

__all__ = ["PipelineAdapter", "adapter_class", "load_model", "resolve_device", "resolve_dtype"]


def adapter_class(family: str) -> type[StableDiffusionAdapter | FluxAdapter | ZImageAdapter]:
    """The adapter class of a family in batching.families.FAMILIES."""
    adapters: dict[str, type[StableDiffusionAdapter | FluxAdapter | ZImageAdapter]] = {
        "sd": StableDiffusionAdapter,
        "sdxl": StableDiffusionXLAdapter,
        "flux": FluxAdapter,
        "zimage": ZImageAdapter,
    }
    return adapters[family]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def load_model(model: str, device: str = "auto", dtype: str = "auto") -> PipelineAdapter:
    """Load `model` (builtin:NAME, a diffusers folder, or a cached repo id) with its family's adapter."""
    torch_device = resolve_device(device)
    source = model_source(model)
    family = detect_family(model, source)
    return adapter_class(family).load(model, source, torch_device, resolve_dtype(dtype, torch_device))
