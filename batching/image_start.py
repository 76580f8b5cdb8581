"""Image-to-image and inpainting samples in the model runner: their start and their per-step blend.

At admission, the init images of the iteration's new samples (decoded and resized once per
job at submit, `core.image_inputs.input_images`) are VAE-encoded in one call per size; each sample then
starts at the step its strength implies (`Sample.first_step`) from its image latents
noised to that step (the adapter's `ImageLatentsMixin`). An inpainting sample keeps its
image latents, its noise and its latent mask (`InpaintGuide`): after every step, the
region outside the mask is replaced by the image latents re-noised to the next timestep
(clean after the last one), the latent-blend method of diffusers' inpaint pipelines for
4-channel UNets, applied to every family. Text-to-image samples never enter here, and
all of this happens outside the forward, so these samples share forwards with
text-to-image samples of the same key. Nor do the samples of an adapter whose init
image conditions its rows instead (`edits_init_image`: edit models, and FLUX.2's reference
images): they start from noise, and the encoder adds the adapter's `image_conditioning`
to their rows.

A model whose denoiser has mask channels (an inpainting UNet, `has_mask_channels`) is
different, as in diffusers' inpaint pipelines: no latent blend; instead every sample,
text-to-image ones included, gets its mask and the latents of its masked image (the init
image where the mask keeps it, 0 where it repaints) as per-row conditioning. A sample
without a mask repaints everything (mask all ones, masked image all zeros), which is what
diffusers' inpaint pipeline computes for an all-white mask; without an init image it
starts from pure noise, so text-to-image works on such a model too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from batching.pipelines.contract import PipelineAdapter
from batching.sample import Sample
from batching.sample_tensors import InpaintGuide, SampleTensors


@dataclass(slots=True)
class EncodedImage:
    mean: torch.Tensor | None  # [1, c, h, w]: the VAE's latent distribution of the init image, raw layout;
    std: torch.Tensor | None  # None: no init image (text-to-image on a model with mask channels)
    mask: torch.Tensor | None  # [1, 1, H, W] float, 1 = repaint; None: plain img2img
    masked: tuple[torch.Tensor, torch.Tensor] | None = None  # mask channels only: the masked image's (mean, std)


@dataclass(slots=True)
class ImageStart:
    latents: torch.Tensor  # [1, *latent_shape]: the sample's first latents
    guide: InpaintGuide | None = None  # latent-blend inpainting only
    row_inputs: dict[str, torch.Tensor] | None = None  # mask channels only: added to each of its rows' conditioning


def encode_init_images(
    adapter: PipelineAdapter, new_samples: Sequence[Sample], *, one_at_a_time: bool = False
) -> dict[str, EncodedImage | Exception]:
    """The encoded init image (and masked image, for mask channels) of each new sample that needs one, or the
    error that refused it; one VAE call per size (per sample with `one_at_a_time`: deterministic mode, where no
    batch size may vary)."""
    results: dict[str, EncodedImage | Exception] = {}
    by_size: dict[Any, list[tuple[str, list[torch.Tensor], torch.Tensor | None]]] = {}
    for new in new_samples:
        if (new.params.init_image is None and not adapter.has_mask_channels) or adapter.edits_init_image:
            continue
        init, mask = (new.images.init, new.images.mask) if new.images is not None else (None, None)
        size = (new.params.height, new.params.width)
        to_encode = [] if init is None else [_to_pixels(init)]  # [1, 3, H, W] in [-1, 1]
        mask_tensor = None if mask is None else torch.from_numpy(np.asarray(mask, dtype=np.float32) / 255.0)[None, None]
        if adapter.has_mask_channels:
            if mask_tensor is None:  # repaint everything
                mask_tensor = torch.ones(1, 1, *size)
            masked = torch.zeros(1, 3, *size) if init is None else to_encode[0] * (mask_tensor < 0.5)
            to_encode.append(masked)  # last: the masked image
        group = new.sample_id if one_at_a_time else size
        by_size.setdefault(group, []).append((new.sample_id, to_encode, mask_tensor))
    for items in by_size.values():
        try:
            mean, std = adapter.encode_images(torch.cat([pixels for _, to_encode, _ in items for pixels in to_encode]))
        except Exception as e:
            for sample_id, _, _ in items:
                results[sample_id] = e
            continue
        row = 0
        for sample_id, to_encode, mask_rows in items:
            rows = [(mean[index : index + 1], std[index : index + 1]) for index in range(row, row + len(to_encode))]
            row += len(to_encode)
            masked_distribution = rows.pop() if adapter.has_mask_channels else None
            init_mean, init_std = rows[0] if rows else (None, None)
            results[sample_id] = EncodedImage(init_mean, init_std, mask_rows, masked=masked_distribution)
    return results


def _to_pixels(image: Any) -> torch.Tensor:
    """[1, 3, H, W] in [-1, 1], contiguous: one memory layout for every image the VAE encodes."""
    return (torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)[None] * 2 - 1).contiguous()


def start_from_image(
    adapter: PipelineAdapter, new: Sample, sampler: Any, generator: torch.Generator, encoded: EncodedImage
) -> ImageStart:
    """The sample's first latents (image latents noised to its first step), and its inpaint guide or its
    mask channels."""
    if hasattr(sampler, "set_begin_index"):  # samplers that count steps start counting here
        sampler.set_begin_index(new.first_step * sampler.order)
    if encoded.masked is not None:
        return _start_with_mask_channels(adapter, new, sampler, generator, encoded)
    assert encoded.mean is not None and encoded.std is not None  # only mask channels start without an init image
    image_latents = adapter.image_latents(encoded.mean, encoded.std, generator)  # first draw, as diffusers
    noise = adapter.draw_noise(new.params, generator)  # second draw
    if encoded.mask is None:
        return ImageStart(adapter.noised_latents(sampler, image_latents, noise, sampler.timesteps[new.first_step]))
    if new.params.strength == 1.0:  # inpainting from pure noise, as diffusers' inpaint pipelines start it
        latents = noise * getattr(sampler, "init_noise_sigma", 1.0)  # flow matching: pure noise
    else:
        latents = adapter.noised_latents(sampler, image_latents, noise, sampler.timesteps[new.first_step])
    return ImageStart(
        latents, guide=InpaintGuide(image_latents, noise, adapter.latent_mask(encoded.mask, encoded.mean.shape))
    )


def _start_with_mask_channels(
    adapter: PipelineAdapter, new: Sample, sampler: Any, generator: torch.Generator, encoded: EncodedImage
) -> ImageStart:
    """Draws in diffusers' inpaint pipeline's order: the init image's latents only when the sample starts from
    it (strength < 1), then the noise, then the masked image's latents."""
    assert encoded.masked is not None and encoded.mask is not None  # set for every sample of such a model
    image_latents = None
    if new.params.strength < 1.0:  # strength below 1 needs an init image
        assert encoded.mean is not None and encoded.std is not None
        image_latents = adapter.image_latents(encoded.mean, encoded.std, generator)
    noise = adapter.draw_noise(new.params, generator)
    masked_image_latents = adapter.image_latents(*encoded.masked, generator)  # [1, c, h, w]
    if image_latents is None:
        latents = noise * sampler.init_noise_sigma
    else:
        latents = adapter.noised_latents(sampler, image_latents, noise, sampler.timesteps[new.first_step])
    return ImageStart(latents, row_inputs=adapter.mask_conditioning(encoded.mask, masked_image_latents))


def blend_unmasked(adapter: PipelineAdapter, sample: SampleTensors) -> None:
    """After a step: outside the mask, put back the image latents noised to the next timestep."""
    guide = sample.guide
    if guide is None:
        return
    if sample.is_finished:
        known = guide.image_latents
    else:
        known = adapter.noised_latents(sample.sampler, guide.image_latents, guide.noise, sample.timestep)
    sample.latents = (1 - guide.mask) * known + guide.mask * sample.latents
