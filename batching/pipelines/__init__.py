"""Pipeline adapters: one class per model family, each exposing the denoiser step contract."""

from __future__ import annotations

import torch

from batching.pipelines.stable_diffusion import StableDiffusionAdapter

__all__ = ["StableDiffusionAdapter", "load_model", "resolve_device", "resolve_dtype"]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def load_model(model: str, device: str = "auto", dtype: str = "auto") -> StableDiffusionAdapter:
    """Load `model` (builtin:NAME, a diffusers folder, or a cached repo id) on the resolved device."""
    torch_device = resolve_device(device)
    return StableDiffusionAdapter.load(model, torch_device, resolve_dtype(dtype, torch_device))
