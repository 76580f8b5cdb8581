"""A pipeline's VAE between pixels and the denoiser's latent space, as the families' pipelines convert.

Three kinds of latent space, told apart by the VAE's config:
- scaled and shifted (SD, SD3, FLUX.1, Z-Image): `(raw - shift_factor) * scaling_factor`;
- normalised per channel with a scale (SDXL VAEs that state `latents_mean`/`latents_std`):
  `(raw - mean) * scaling_factor / std`;
- the causal video VAEs (Qwen-Image's, Wan's: `z_dim`): latents [n, c, frames, h, w] normalised per
  channel, `(raw - mean) / std`; an image is one frame, a video many (`decode_video`, `encode_mode`).
  They keep their convolution caches on the module, so they run one call at a time (`lock`): the
  decoder's thread decodes while the encoder's thread encodes.
FLUX.2's VAE normalises patchified latents with its batch norm's statistics: its adapter does that.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import numpy as np
import torch
from PIL import Image


class LatentVae:
    def __init__(self, vae: Any) -> None:
        self.vae = vae
        config = vae.config
        self.has_frames = "z_dim" in config
        self.lock: contextlib.AbstractContextManager = threading.Lock() if self.has_frames else contextlib.nullcontext()
        self.mean: torch.Tensor | None = None  # per-channel statistics, [1, c, 1, 1] (with frames [1, c, 1, 1, 1])
        self.std: torch.Tensor | None = None
        if getattr(config, "latents_mean", None) is not None and getattr(config, "latents_std", None) is not None:
            shape = (1, -1, 1, 1, 1) if self.has_frames else (1, -1, 1, 1)
            self.mean = torch.tensor(config.latents_mean).view(shape).to(vae.device, vae.dtype)
            self.std = torch.tensor(config.latents_std).view(shape).to(vae.device, vae.dtype)

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor) -> list[Image.Image | None]:
        """Latents [n, c, h, w] in the denoiser's space to n RGB images (None for one with non-finite pixels)."""
        config = self.vae.config
        latents = latents.to(self.vae.dtype)
        if self.has_frames:
            assert self.mean is not None and self.std is not None
            raw = latents.unsqueeze(2) / (1.0 / self.std) + self.mean  # [n, c, 1, h, w], as the pipelines undo it
        elif self.mean is not None and self.std is not None:
            raw = latents * self.std.to(latents) / config.scaling_factor + self.mean.to(latents)
        else:
            raw = latents / config.scaling_factor
            if getattr(config, "shift_factor", None):
                raw = raw + config.shift_factor
        with self.lock:
            pixels = self.vae.decode(raw, return_dict=False)[0]  # [n, 3, H, W] (with frames: [n, 3, 1, H, W])
        return pixels_to_images(pixels[:, :, 0] if self.has_frames else pixels)

    @torch.inference_mode()
    def decode_video(self, latents: torch.Tensor) -> list[list[Image.Image] | None]:
        """Video latents [n, c, latent frames, h, w] in the denoiser's space to each video's RGB frames (None for
        a video with a non-finite pixel), as the video pipelines decode and post-process them."""
        assert self.has_frames and self.mean is not None and self.std is not None
        raw = latents.to(self.vae.dtype) / (1.0 / self.std) + self.mean
        with self.lock:
            pixels = self.vae.decode(raw, return_dict=False)[0]  # [n, 3, frames, H, W]
        videos = [pixels_to_images(video.permute(1, 0, 2, 3)) for video in pixels]  # frames [frames, 3, H, W]
        return [None if any(frame is None for frame in frames) else frames for frames in videos]  # type: ignore[misc]

    @torch.inference_mode()
    def encode_mode(self, pixels: torch.Tensor) -> torch.Tensor:
        """RGB pixels [n, 3, H, W] (a video VAE's: [n, 3, frames, H, W]) in [-1, 1] to the mode of the VAE's latent
        distribution, in the VAE's raw space: what the edit and image-to-video pipelines condition on."""
        with self.lock:
            return self.vae.encode(pixels.to(self.vae.device, self.vae.dtype)).latent_dist.mode()

    @torch.inference_mode()
    def encode(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RGB pixels [n, 3, H, W] in [-1, 1] to the VAE's latent distribution (mean, std), each [n, c, h, w]
        in the VAE's raw space: one encoder call for the batch; each sample draws from it with its own generator."""
        pixels = pixels.to(self.vae.device, self.vae.dtype)
        with self.lock:
            distribution = self.vae.encode(pixels.unsqueeze(2) if self.has_frames else pixels).latent_dist
        if self.has_frames:
            return distribution.mean[:, :, 0], distribution.std[:, :, 0]
        return distribution.mean, distribution.std

    def to_latent_space(self, raw: torch.Tensor) -> torch.Tensor:
        """A raw VAE latent to the space the denoiser works in: the inverse of `decode`'s conversion."""
        config = self.vae.config
        if self.has_frames:
            assert self.mean is not None and self.std is not None
            mean, std = (stat.to(raw.device, raw.dtype) for stat in (self.mean, self.std))
            return (raw - mean[:, :, 0]) / std[:, :, 0] if raw.ndim == 4 else (raw - mean) / std
        if self.mean is not None and self.std is not None:
            return (raw - self.mean.to(raw)) * config.scaling_factor / self.std.to(raw)
        if getattr(config, "shift_factor", None):
            raw = raw - config.shift_factor
        return raw * config.scaling_factor


def pixels_to_images(pixels: torch.Tensor) -> list[Image.Image | None]:
    """Decoded pixels [n, 3, H, W] in [-1, 1] to RGB images as diffusers' image processor makes them; None for
    an image with a NaN or infinite pixel (non-finite latents, or a VAE overflowing in half precision): cast to
    bytes it would be a black or noisy picture that looks like a result."""
    pixels = pixels.float()
    is_finite = torch.isfinite(pixels).flatten(1).all(1).cpu().tolist()  # [n]
    pixels = (pixels / 2 + 0.5).clamp(0, 1)
    array = (pixels.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).cpu().numpy()
    return [Image.fromarray(np.ascontiguousarray(image)) if ok else None for image, ok in zip(array, is_finite)]
