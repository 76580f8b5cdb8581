"""Latents to RGB images through a pipeline's VAE, as every family's pipeline decodes them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image


@torch.inference_mode()
def decode_latents(vae: Any, latents: torch.Tensor) -> list[Image.Image | None]:
    """Latents [n, c, h, w] (the VAE's layout) to n RGB images (None for one with non-finite pixels)."""
    config = vae.config
    latents = latents.to(vae.dtype)
    latents_mean, latents_std = getattr(config, "latents_mean", None), getattr(config, "latents_std", None)
    if latents_mean is not None and latents_std is not None:  # SDXL VAEs that state their latent statistics
        shape = (1, -1, 1, 1)
        mean = torch.tensor(latents_mean, device=latents.device, dtype=latents.dtype).view(shape)
        std = torch.tensor(latents_std, device=latents.device, dtype=latents.dtype).view(shape)
        return _to_images(vae, latents * std / config.scaling_factor + mean)
    latents = latents / config.scaling_factor
    if getattr(config, "shift_factor", None):
        latents = latents + config.shift_factor
    return _to_images(vae, latents)


def _to_images(vae: Any, latents: torch.Tensor) -> list[Image.Image | None]:
    return pixels_to_images(vae.decode(latents, return_dict=False)[0])


def pixels_to_images(pixels: torch.Tensor) -> list[Image.Image | None]:
    """Decoded pixels [n, 3, H, W] in [-1, 1] to RGB images as diffusers' image processor makes them; None for
    an image with a NaN or infinite pixel (non-finite latents, or a VAE overflowing in half precision): cast to
    bytes it would be a black or noisy picture that looks like a result."""
    pixels = pixels.float()
    is_finite = torch.isfinite(pixels).flatten(1).all(1).cpu().tolist()  # [n]
    pixels = (pixels / 2 + 0.5).clamp(0, 1)
    array = (pixels.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).cpu().numpy()
    return [Image.fromarray(np.ascontiguousarray(image)) if ok else None for image, ok in zip(array, is_finite)]


@torch.inference_mode()
def encode_pixels(vae: Any, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RGB pixels [n, 3, H, W] in [-1, 1] to the VAE's latent distribution (mean, std), each [n, c, h, w]
    in the VAE's raw space: one encoder call for the batch; each sample draws from it with its own generator."""
    distribution = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist
    return distribution.mean, distribution.std


def to_latent_space(vae: Any, raw: torch.Tensor) -> torch.Tensor:
    """A raw VAE latent to the space the denoiser works in: the inverse of `decode_latents`' scaling."""
    config = vae.config
    latents_mean, latents_std = getattr(config, "latents_mean", None), getattr(config, "latents_std", None)
    if latents_mean is not None and latents_std is not None:
        shape = (1, -1, 1, 1)
        mean = torch.tensor(latents_mean, device=raw.device, dtype=raw.dtype).view(shape)
        std = torch.tensor(latents_std, device=raw.device, dtype=raw.dtype).view(shape)
        return (raw - mean) * config.scaling_factor / std
    if getattr(config, "shift_factor", None):
        raw = raw - config.shift_factor
    return raw * config.scaling_factor
