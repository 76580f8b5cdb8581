"""The image-to-image part of the pipeline contract, shared by every family's adapter.

As the families' diffusers img2img pipelines do it: the init image is VAE-encoded, each
sample draws its latent from the encoder's distribution with its own generator (first),
then draws its noise (second), and starts from the image latents noised to the first
timestep it runs (`noised_latents`: `add_noise` for the UNet samplers, `scale_noise` for flow matching).
Inpainting keeps the same noise to re-noise the image latents at every later step
(`batching.image_start`). A family whose latents are packed (FLUX) overrides
`pack_latents`; one whose latents are float32 whatever the model dtype (Z-Image) sets
`latent_dtype`.
"""

from __future__ import annotations

import torch
from diffusers.utils.torch_utils import randn_tensor

from batching.pipelines.contract import Sampler
from batching.pipelines.vae import LatentVae
from core.image_inputs import InputImages
from core.params import GenerationParams


class ImageLatentsMixin:
    latent_vae: LatentVae
    device: torch.device
    dtype: torch.dtype
    # The denoiser takes the mask and the masked image's latents as input channels (an inpainting UNet):
    # every sample then gets them, and inpainting runs without the latent blend.
    has_mask_channels: bool = False
    # An edit model: init_image conditions the denoiser (the adapter encodes it), the sample starts from noise.
    edits_init_image: bool = False

    @property
    def latent_dtype(self) -> torch.dtype:
        return self.dtype

    def draw_noise(self, params: GenerationParams, generator: torch.Generator) -> torch.Tensor:
        """[1, *latent_shape] standard normal noise, drawn as the family's pipeline draws it."""
        raise NotImplementedError

    def encode_images(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixels [n, 3, H, W] in [-1, 1] (samples of one size) to the VAE's (mean, std), raw layout."""
        return self.latent_vae.encode(pixels)

    def image_latents(self, mean: torch.Tensor, std: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """[1, *latent_shape]: one sample's draw from its image's latent distribution, in denoiser space."""
        raw = mean + std * randn_tensor(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return self.pack_latents(self.latent_vae.to_latent_space(raw).to(self.latent_dtype))

    def latent_mask(self, mask: torch.Tensor, raw_shape: torch.Size) -> torch.Tensor:
        """A [1, 1, H, W] pixel mask (1 = repaint) in the latents' layout, downsampled as diffusers' inpaint
        pipelines do (nearest)."""
        small = torch.nn.functional.interpolate(mask, size=tuple(raw_shape[-2:]))
        return self.pack_latents(small.expand(-1, raw_shape[1], -1, -1).to(self.device, self.latent_dtype))

    def noised_latents(
        self, sampler: Sampler, image_latents: torch.Tensor, noise: torch.Tensor, timestep: torch.Tensor
    ) -> torch.Tensor:
        """The image latents noised to `timestep` of the sample's sampler, as the family's sampler noises them."""
        raise NotImplementedError

    def mask_conditioning(self, mask: torch.Tensor, masked_image_latents: torch.Tensor) -> dict[str, torch.Tensor]:
        """The per-row conditioning that carries a sample's mask channels (adapters with `has_mask_channels`)."""
        raise NotImplementedError

    def image_conditioning(
        self, params: GenerationParams, images: InputImages
    ) -> dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]:
        """What an `edits_init_image` sample's init image adds to its rows (none, unless the family says)."""
        return {}

    def pack_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """[1, c, h, w] in the VAE's layout to the denoiser's (the identity, except for packing families)."""
        return latents
