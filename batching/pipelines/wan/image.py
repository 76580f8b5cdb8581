"""Image-to-video: a sample's first frame as `WanImageToVideoPipeline` conditions every forward on it.

The job's `init_image` (decoded once at submit and fitted to the job's size, `core.image_inputs`)
is the video's first frame. As the pipeline's `prepare_latents`: the video [that frame, then
`num_frames - 1` black frames] in [-1, 1] is VAE-encoded (the distribution's mode, normalised per
channel in float32), and a 4-channel mask marks the first latent frame (1) from the rest (0); the
transformer's input is then [noise latents | mask | image latents] on the channels (16 + 4 + 16).
A checkpoint with an image encoder (Wan 2.1 I2V's CLIP ViT-H) also cross-attends to its
penultimate hidden states of the image (`image_embeds`). None of it depends on the sample's seed:
the sample's noise is drawn as text-to-video's.

Each row carries the condition as tokens [latent frames x h x w, 20] (the input batch pads rows of
different sizes along their first axis), laid back on its grid in the forward (`unflatten_condition`).
The samples of one job (`num_images`), or jobs animating one picture alike, share one encoding: the
last few are kept (a video's VAE encode is the costly part).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from batching.pipelines.contract import Conditioning
from batching.pipelines.encoded_images import EncodedImages
from batching.pipelines.vae import LatentVae
from core.params import GenerationParams

NUM_CACHED = 4  # first-frame conditionings kept, by image and video shape


class FirstFrame:
    def __init__(self, pipeline: Any, latent_vae: LatentVae, device: torch.device) -> None:
        self.pipeline = pipeline
        self.latent_vae = latent_vae
        self.device = device
        config = pipeline.vae.config
        shape = (1, config.z_dim, 1, 1, 1)
        self.latents_mean = torch.tensor(config.latents_mean).view(shape).to(device, torch.float32)
        self.latents_std_inverse = 1.0 / torch.tensor(config.latents_std).view(shape).to(device, torch.float32)
        self.mask_channels = pipeline.vae_scale_factor_temporal  # the mask's channels: a latent frame's frames
        transformer = pipeline.transformer or pipeline.transformer_2
        self.has_image_embeds = pipeline.image_encoder is not None and transformer.config.image_dim is not None
        self._encoded: EncodedImages[Conditioning] = EncodedImages(NUM_CACHED)

    def conditioning(self, params: GenerationParams, image: Any) -> Conditioning:
        """What each of the sample's rows carries: its condition tokens, and its image embeds where the model has
        an image encoder (shared, read-only, by the samples of one image and shape)."""
        key = (hashlib.sha256(image.tobytes()).hexdigest(), image.size, params.height, params.width, params.num_frames)
        return self._encoded.get(key, lambda: self._encode(params, image))

    @torch.inference_mode()
    def _encode(self, params: GenerationParams, image: Any) -> Conditioning:
        pipeline = self.pipeline
        pixels = pipeline.video_processor.preprocess(image, height=params.height, width=params.width)
        pixels = pixels.to(self.device, dtype=torch.float32)  # [1, 3, H, W] in [-1, 1]
        blank = pixels.new_zeros(1, 3, params.num_frames - 1, params.height, params.width)
        video = torch.cat([pixels.unsqueeze(2), blank], dim=2)  # [1, 3, frames, H, W]
        latents = self.latent_vae.encode_mode(video).to(self.device, torch.float32)  # [1, z, f, h, w], raw
        latents = (latents - self.latents_mean) * self.latents_std_inverse
        mask = torch.zeros(1, self.mask_channels, *latents.shape[2:], device=self.device)
        mask[:, :, 0] = 1  # the first latent frame is the given image
        condition = torch.cat([mask, latents], dim=1)[0]  # [4 + z, f, h, w]
        row: Conditioning = {"condition": condition.flatten(1).T.contiguous()}  # [f * h * w, 4 + z]
        if self.has_image_embeds:
            row["image_embeds"] = self._image_embeds(image)
        return row

    def padding(self, noise_shape: tuple[int, ...], dtype: torch.dtype) -> Conditioning:
        """A deterministic-mode padding row's condition (and image embeds) for samples of `noise_shape`."""
        _, channels, frames, height, width = noise_shape
        row: Conditioning = {
            "condition": torch.zeros(frames * height * width, self.mask_channels + channels, device=self.device)
        }
        if self.has_image_embeds:
            config = self.pipeline.image_encoder.config
            num_tokens = (config.image_size // config.patch_size) ** 2 + 1  # the patches and the class token
            row["image_embeds"] = torch.zeros(num_tokens, config.hidden_size, device=self.device, dtype=dtype)
        return row

    def _image_embeds(self, image: Any) -> torch.Tensor:
        """The image encoder's penultimate hidden states of the image, as the pipeline's `encode_image`."""
        pipeline = self.pipeline
        inputs = pipeline.image_processor(images=image, return_tensors="pt").to(self.device)
        hidden = pipeline.image_encoder(**inputs, output_hidden_states=True).hidden_states[-2]  # [1, tokens, dim]
        transformer = pipeline.transformer or pipeline.transformer_2
        return hidden[0].to(transformer.dtype)


def unflatten_condition(condition: torch.Tensor, latent_shape: Any) -> torch.Tensor:
    """Condition tokens [..., tokens (padded), channels] back on the grid of latents of `latent_shape` (its last
    three axes: frames, height, width): [..., channels, frames, height, width]."""
    frames, height, width = latent_shape[-3:]
    own = condition[..., : frames * height * width, :]
    return own.transpose(-1, -2).unflatten(-1, (frames, height, width))
