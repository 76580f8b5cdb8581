"""The FLUX.2 family (`Flux2Pipeline`: FLUX.2-dev) behind the pipeline contract (a flow-matching family).

As `Flux2Pipeline` does it: the prompt goes through the text encoder's chat template after
FLUX.2's system message, padded to 512 tokens, and the hidden states of its chosen layers are
stacked per token (the pipeline's own `encode_prompt`, one call for every text of an iteration);
text position ids are (0, 0, 0, token). Latents are drawn as [1, 4c, h/16, w/16] (already 2x2
patchified) and flattened to tokens [1, (h/16)*(w/16), 4c] with ids (0, row, column, 0); the
sampler's shift `mu` is FLUX.2's empirical function of the token count and the step count.
FLUX.2-dev is guidance-distilled: one row per sample, its guidance a per-row model input. Decode
undoes the VAE's batch-norm normalisation, unpatchifies and runs the VAE.

Reference images (multi-reference editing): a job's `reference_images` (or its `init_image`, the
one-image form) are read at submit as the pipeline reads its `image=[...]`, each at its own size
(`core.image_inputs.reference_image`), VAE-encoded to its mode, patchified, normalised, and their
tokens follow the noise tokens in the sequence, the i-th image's with ids (10 + 10 * i, row, column,
0); the model's prediction for them is dropped. They are row conditioning (`image_conditioning`:
"reference", "image_ids"), so a job with any number of references shares forwards with plain jobs:
rows whose token counts or positions differ (sizes, references) run packed (`flux2.packed`: one token
sequence, each row rotated by its own ids, attention per row); a forward whose rows agree runs
diffusers' forward as is.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from batching.pipelines import published_latent_rgb as published
from batching.pipelines.contract import CachedForward, CachedSample, Conditioning, ForwardBatch
from batching.pipelines.encoded_images import EncodedImages
from batching.pipelines.flow_matching import FlowMatchingAdapter
from batching.pipelines.flux.packed import FluxLayout, build_layout, output, position_ids
from batching.pipelines.flux.step_cache import NUM_BLOCKS_KEPT, first_block_cached_blocks, num_flux_blocks
from batching.pipelines.flux2 import packed
from batching.pipelines.packing import LayoutCache
from batching.pipelines.vae import pixels_to_images
from core.image_inputs import InputImages, listed_images
from core.params import GenerationParams

MAX_SEQUENCE_LENGTH = 512  # Flux2Pipeline's default
REFERENCE_TIME_STEP = 10  # the time coordinate of the i-th reference image is 10 + 10 * i
NUM_CACHED_REFERENCES = 10  # encoded reference images kept (one job's list, at most)


class Flux2Adapter(FlowMatchingAdapter):
    family = "flux2"
    pipeline_classes = ("Flux2Pipeline",)
    published_latent_rgb = published.FLUX2
    edits_init_image = True  # a reference image: image_conditioning, and the sample starts from noise
    token_patch = 1  # its latents are drawn 2x2-patchified already

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.num_channels = self.transformer.config.in_channels  # per token: 2x2 patches of the VAE's channels
        self.has_guidance_embeds = bool(self.transformer.config.guidance_embeds)
        self.layouts: LayoutCache[tuple[FluxLayout, bool]] = LayoutCache()
        self.text_ids = position_ids(0, 1, 1, MAX_SEQUENCE_LENGTH).to(device)  # [512, 4]: (0, 0, 0, token)
        # a reference image (its data URI) -> its tokens [r, c] and latent grid (h, w) (the job's images share
        # them; so do retries)
        self._references: EncodedImages[tuple[torch.Tensor, tuple[int, int]]] = EncodedImages(NUM_CACHED_REFERENCES)
        self.num_cache_blocks = num_flux_blocks(self.transformer)  # First-Block Cache (flux.step_cache), as FLUX.1
        self.num_blocks_kept = NUM_BLOCKS_KEPT

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        embeds, _ = self.pipeline.encode_prompt(
            prompt=list(texts), device=self.device, max_sequence_length=MAX_SEQUENCE_LENGTH
        )  # [n, 512, layers * text_dim]
        return [{"embeds": row.to(self.dtype)} for row in embeds]

    def noise_shape(self, params: GenerationParams) -> tuple[int, ...]:
        return (1, self.num_channels, *self.token_grid(params))

    def shift_mu(self, params: GenerationParams) -> float:
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        return compute_empirical_mu(image_seq_len=self.num_image_tokens(params), num_steps=params.num_inference_steps)

    def row_extras(self, params: GenerationParams) -> Conditioning:
        guidance = torch.tensor(float(params.guidance_scale), device=self.device, dtype=torch.float32)
        return {
            "guidance": guidance,
            "reference": self.zeros(0, self.num_channels),
            "image_ids": self._image_ids(params),
        }

    def image_conditioning(self, params: GenerationParams, images: InputImages) -> Conditioning:
        """The reference images' tokens [r, c] one after another, and the row's image ids: the noise tokens', then
        each reference's, the i-th at time 10 + 10 * i (the pipeline's `_prepare_image_ids`)."""
        tokens, ids = [], [self._image_ids(params)]
        for index, ((_, value), image) in enumerate(zip(listed_images(params, self.spec), images.listed, strict=True)):
            reference, (height, width) = self._references.get(value, functools.partial(self._encode_reference, image))
            tokens.append(reference)
            ids.append(position_ids(REFERENCE_TIME_STEP * (1 + index), height, width, 1).to(self.device))
        return {"reference": torch.cat(tokens), "image_ids": torch.cat(ids)}

    def padding_row(self, params: GenerationParams) -> Conditioning:
        embeds = self.zeros(MAX_SEQUENCE_LENGTH, self.transformer.config.joint_attention_dim)
        return {**self.row_extras(params), "embeds": embeds, "guidance": self.zeros(dtype=torch.float32)}

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        layout, is_uniform = self._layout(batch)
        rows, inputs = self._inputs(batch, layout)
        if is_uniform:  # rows alike: diffusers' own forward
            predictions = self.transformer(
                hidden_states=torch.stack(rows).to(self.transformer.dtype),
                timestep=inputs["timestep"],
                guidance=inputs["guidance"],
                encoder_hidden_states=inputs["embeds"],
                txt_ids=self.text_ids,
                img_ids=batch.conditioning["image_ids"][0],
                return_dict=False,
            )[0]
            return batch.own_tokens(list(predictions))
        hidden = torch.cat(rows)[None].to(self.transformer.dtype)  # [1, image tokens, c]
        predictions = packed.forward(self.transformer, layout, hidden, **inputs)  # [1, image tokens, c]
        return batch.own_tokens(layout.image.split(predictions[0]))

    @torch.inference_mode()
    def forward_cached(
        self, batch: ForwardBatch, samples: Sequence[CachedSample], *, may_gather: bool
    ) -> CachedForward:
        layout, _ = self._layout(batch)
        rows, inputs = self._inputs(batch, layout)
        model = self.transformer
        state = packed.embed(model, layout, torch.cat(rows)[None].to(model.dtype), **inputs)
        run_blocks = functools.partial(packed.run_blocks, model)
        image, skipped = first_block_cached_blocks(model, layout, state, run_blocks, samples, may_gather=may_gather)
        predictions = output(model, image, state.temb, layout)  # [1, image tokens, c]
        return CachedForward(batch.own_tokens(layout.image.split(predictions[0])), skipped)

    def _inputs(self, batch: ForwardBatch, layout: FluxLayout) -> tuple[list[torch.Tensor], dict[str, Any]]:
        """Each row's image tokens (its noise, then its reference's) [tokens_i, c] and `packed.embed`'s other
        inputs; counts the forward's positions."""
        conditioning = batch.conditioning
        references = conditioning["reference"]  # [rows, most reference tokens, c], zero-padded
        rows = [
            torch.cat([own, ref[:n]]) for own, ref, n in zip(batch.latents, references, batch.row_lengths("reference"))
        ]
        batch.count_positions([MAX_SEQUENCE_LENGTH + n for n in layout.image.lengths])
        inputs: dict[str, Any] = {
            "timestep": batch.timesteps.to(rows[0].dtype) / 1000,
            "guidance": conditioning["guidance"] if self.has_guidance_embeds else None,
            "embeds": conditioning["embeds"],  # [rows, 512, layers * text_dim]
        }
        return rows, inputs

    def _layout(self, batch: ForwardBatch) -> tuple[FluxLayout, bool]:
        """The rows' packed layout (noise, then reference tokens), and whether every row has the same positions."""

        def build() -> tuple[FluxLayout, bool]:
            image_ids = batch.conditioning["image_ids"]  # [rows, most tokens, 4], zero-padded
            lengths = batch.row_lengths("image_ids")
            rows = [ids[:length] for ids, length in zip(image_ids, lengths)]
            is_uniform = len(set(lengths)) == 1 and bool((image_ids == image_ids[:1]).all())
            return build_layout(self.transformer, self.text_ids, rows), is_uniform

        return self.layouts.get(batch.membership or None, build)

    def decode(self, latents: torch.Tensor, params_list: Sequence[GenerationParams]) -> list[Image.Image | None]:
        patches = self.unpack_latents(latents, params_list[0])  # [n, c, h/16, w/16]
        mean, std = self._batch_norm_statistics(patches)
        patches = patches * std + mean
        num, channels, height, width = patches.shape[0], self.num_channels // 4, *patches.shape[-2:]
        raw = patches.reshape(num, channels, 2, 2, height, width).permute(0, 1, 4, 2, 5, 3)  # unpatchify the VAE's
        raw = raw.reshape(num, channels, 2 * height, 2 * width)
        return pixels_to_images(self.vae.decode(raw, return_dict=False)[0])

    @torch.inference_mode()
    def _encode_reference(self, image: Any) -> tuple[torch.Tensor, tuple[int, int]]:
        """The tokens [r, c] of `image` (RGB, scaled and cropped as the pipeline prepares a reference:
        core.image_inputs) as the pipeline encodes a reference image, and their grid (rows, columns)."""
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)[None] * 2 - 1
        raw = self.latent_vae.encode_mode(pixels)  # [1, c/4, h, w]
        _, channels, height, width = raw.shape
        patches = raw.view(1, channels, height // 2, 2, width // 2, 2).permute(0, 1, 3, 5, 2, 4)
        patches = patches.reshape(1, channels * 4, height // 2, width // 2)
        mean, std = self._batch_norm_statistics(patches)
        tokens = self.pack_latents((patches - mean) / std)[0]  # [r, c]
        return tokens.to(self.device, self.dtype), (height // 2, width // 2)

    def _batch_norm_statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's latent normalisation (its batch norm's running mean and std), shaped to broadcast over `like`."""
        batch_norm = self.vae.bn
        mean = batch_norm.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(batch_norm.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps)
        return mean.to(like.device, like.dtype), std.to(like.device, like.dtype)

    def _image_ids(self, params: GenerationParams) -> torch.Tensor:
        """[tokens, 4] positions of the noise tokens: (0, row, column, 0)."""
        return position_ids(0, *self.token_grid(params), 1).to(self.device)
