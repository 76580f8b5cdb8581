"""What every family's adapter holds: the loaded pipeline, its VAE and where it runs."""

from __future__ import annotations

from typing import Any

import torch

from batching.families import FAMILIES
from batching.pipelines.image_latents import ImageLatentsMixin


class AdapterBase(ImageLatentsMixin):
    family: str  # a key of batching.families.FAMILIES, set by each adapter class

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model  # the name jobs ask for: "builtin:tiny", a folder, or a repo id
        self.device = device
        self.dtype = dtype
        self.spec = FAMILIES[self.family]
        self.pipeline = pipeline
        self.vae = pipeline.vae
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
