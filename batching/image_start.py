"""Image-to-image and inpainting samples in the model runner: their start and their per-step blend.

At admission, the init images of the iteration's new samples are decoded and resized
(`batching.image_inputs`, Pillow) and VAE-encoded in one call per size; each sample then
starts at the step its strength implies (`NewSample.first_step`) from its image latents
noised to that step (the adapter's `ImageLatentsMixin`). An inpainting sample keeps its
image latents, its noise and its latent mask (`InpaintGuide`): after every step, the
region outside the mask is replaced by the image latents re-noised to the next timestep
(clean after the last one), the latent-blend method of diffusers' inpaint pipelines for
4-channel UNets, applied to every family. Text-to-image samples never enter here, and
all of this happens outside the forward, so these samples share forwards with
text-to-image samples of the same key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from batching.image_inputs import job_images
from batching.plan import NewSample


@dataclass(slots=True)
class EncodedImage:
    mean: torch.Tensor  # [1, c, h, w]: the VAE's latent distribution of the init image, raw layout
    std: torch.Tensor
    mask: torch.Tensor | None  # [1, 1, H, W] float, 1 = repaint; None: plain img2img


@dataclass(slots=True)
class InpaintGuide:
    image_latents: torch.Tensor  # [1, *latent_shape] in denoiser space
    noise: torch.Tensor  # the noise the sample started from
    mask: torch.Tensor  # latent layout, 1 = repaint


def encode_init_images(
    adapter: Any, new_samples: Sequence[NewSample], *, one_at_a_time: bool = False
) -> dict[str, EncodedImage | Exception]:
    """The encoded init image of each new sample that has one (or the error that refused it), one VAE call
    per size (per image with `one_at_a_time`: deterministic mode, where no batch size may vary)."""
    results: dict[str, EncodedImage | Exception] = {}
    by_size: dict[Any, list[tuple[str, torch.Tensor, torch.Tensor | None]]] = {}
    for new in new_samples:
        if new.params.init_image is None:
            continue
        try:
            init, mask = job_images(new.params)
        except Exception as e:
            results[new.sample_id] = e
            continue
        assert init is not None  # init_image is set
        pixels = torch.from_numpy(np.asarray(init, dtype=np.float32) / 255.0).permute(2, 0, 1)[None] * 2 - 1
        mask_tensor = None if mask is None else torch.from_numpy(np.asarray(mask, dtype=np.float32) / 255.0)[None, None]
        group = new.sample_id if one_at_a_time else (init.height, init.width)
        by_size.setdefault(group, []).append((new.sample_id, pixels, mask_tensor))
    for items in by_size.values():
        try:
            mean, std = adapter.encode_images(torch.cat([pixels for _, pixels, _ in items]))
        except Exception as e:
            for sample_id, _, _ in items:
                results[sample_id] = e
            continue
        for index, (sample_id, _, mask_rows) in enumerate(items):
            results[sample_id] = EncodedImage(mean[index : index + 1], std[index : index + 1], mask_rows)
    return results


def start_from_image(
    adapter: Any, new: NewSample, sampler: Any, generator: torch.Generator, encoded: EncodedImage
) -> tuple[torch.Tensor, InpaintGuide | None]:
    """The sample's first latents (image latents noised to its first step) and its inpaint guide."""
    if hasattr(sampler, "set_begin_index"):  # samplers that count steps start counting here
        sampler.set_begin_index(new.first_step * sampler.order)
    image_latents = adapter.image_latents(encoded.mean, encoded.std, generator)  # first draw, as diffusers
    noise = adapter.draw_noise(new.params, generator)  # second draw
    if encoded.mask is None:
        return adapter.noised_latents(sampler, image_latents, noise, sampler.timesteps[new.first_step]), None
    if new.params.strength == 1.0:  # inpainting from pure noise, as diffusers' inpaint pipelines start it
        latents = noise * getattr(sampler, "init_noise_sigma", 1.0)  # flow matching: pure noise
    else:
        latents = adapter.noised_latents(sampler, image_latents, noise, sampler.timesteps[new.first_step])
    return latents, InpaintGuide(image_latents, noise, adapter.latent_mask(encoded.mask, encoded.mean.shape))


def blend_unmasked(adapter: Any, sample: Any) -> None:
    """After a step: outside the mask, put back the image latents noised to the next timestep."""
    guide: InpaintGuide | None = sample.guide
    if guide is None:
        return
    if sample.is_finished:
        known = guide.image_latents
    else:
        known = adapter.noised_latents(sample.sampler, guide.image_latents, guide.noise, sample.timestep)
    sample.latents = (1 - guide.mask) * known + guide.mask * sample.latents
