"""Pipeline adapters: one class per model family, each exposing the denoiser step contract."""

from batching.pipelines.stable_diffusion import StableDiffusionAdapter

__all__ = ["StableDiffusionAdapter"]
