"""The FLUX.2 family (`Flux2Pipeline`: FLUX.2-dev) behind the pipeline contract.

As `Flux2Pipeline` does it: the prompt goes through the text encoder's chat template
after FLUX.2's system message, padded to 512 tokens, and the hidden states of its
chosen layers are stacked per token (the pipeline's own `encode_prompt`, one call for
every text of an iteration); text position ids are (0, 0, 0, token). Latents are drawn
as [1, 4c, h/16, w/16] (already 2x2-patchified) from the sample's own generator and
flattened to tokens [1, (h/16)*(w/16), 4c] with ids (0, row, column, 0); the sampler is
flow-matching Euler whose shift `mu` is FLUX.2's empirical function of the token count
and the step count. FLUX.2-dev is guidance-distilled: one row per sample, its guidance a
per-row model input. Decode undoes the VAE's batch-norm normalisation, unpatchifies and
runs the VAE.

Reference images (multi-reference editing): a job's `init_image` is read at submit as
the pipeline reads its `image` (`core.image_inputs.reference_image`), VAE-encoded to
its mode, patchified, normalised, and its tokens follow the noise tokens in the sequence
with ids (10, row, column, 0); the model's prediction for them is dropped. They are row
conditioning (`image_conditioning`: "reference", "image_ids"), so a job with references
shares forwards with plain jobs: rows whose token counts or positions differ (sizes, references) are padded
and run the attention of `flux2_mixed_sizes` (per-row positions, padding keys masked);
a forward whose rows agree runs diffusers' attention as is.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from diffusers.utils.torch_utils import randn_tensor

from batching.pipelines import published_latent_rgb as published
from batching.pipelines.adapter_base import AdapterBase
from batching.pipelines.contract import Conditioning, ForwardBatch, RunningSample
from batching.pipelines.flow_matching import flow_matching_sampler
from batching.pipelines.flux2_mixed_sizes import Flux2RowAttention
from batching.pipelines.flux_mixed_sizes import RowLayout, row_layout
from batching.pipelines.vae import pixels_to_images
from core.image_inputs import InputImages
from core.params import GenerationParams

MAX_SEQUENCE_LENGTH = 512  # Flux2Pipeline's default
REFERENCE_TIME_STEP = 10  # the time coordinate of the i-th reference image is 10 + 10 * i
NUM_CACHED_REFERENCES = 4  # encoded reference images kept


class Flux2Adapter(AdapterBase):
    family = "flux2"
    pipeline_classes = ("Flux2Pipeline",)
    max_rows_per_sample = 1
    published_latent_rgb = published.FLUX2
    edits_init_image = True  # a reference image: image_conditioning, and the sample starts from noise

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.transformer = pipeline.transformer
        self.num_channels = self.transformer.config.in_channels  # per token: 2x2 patches of the VAE's channels
        self.has_guidance_embeds = bool(self.transformer.config.guidance_embeds)
        self.attention = Flux2RowAttention(self.transformer)
        self.text_ids = _position_ids(0, 1, 1, MAX_SEQUENCE_LENGTH).to(device)  # [512, 4]: (0, 0, 0, token)
        # init_image -> its tokens [r, c] and ids [r, 4] (the job's images share them; so do retries)
        self._references: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._layout: tuple[torch.Tensor, tuple[int, ...], RowLayout] | None = None  # the last mixed layout

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        embeds, _ = self.pipeline.encode_prompt(
            prompt=list(texts), device=self.device, max_sequence_length=MAX_SEQUENCE_LENGTH
        )  # [n, 512, layers * text_dim]
        return [{"embeds": row.to(self.dtype)} for row in embeds]

    def new_sampler(self, params: GenerationParams) -> Any:
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        num_tokens = self._num_tokens(params)
        mu = compute_empirical_mu(image_seq_len=num_tokens, num_steps=params.num_inference_steps)
        config = self.pipeline.scheduler.config
        return flow_matching_sampler(config, params.num_inference_steps, num_tokens, self.device, mu=mu)

    def draw_noise(self, params: GenerationParams, generator: torch.Generator) -> torch.Tensor:
        height, width = self._token_grid(params)
        shape = (1, self.num_channels, height, width)
        noise = randn_tensor(shape, generator=generator, device=self.device, dtype=self.dtype)
        return noise.flatten(2).transpose(1, 2)  # [1, tokens, c]

    def initial_latents(self, params: GenerationParams, sampler: Any, generator: torch.Generator) -> torch.Tensor:
        return self.draw_noise(params, generator)

    def row_conditioning(self, params: GenerationParams, encoded: Mapping[str, Conditioning]) -> list[Conditioning]:
        guidance = torch.tensor(float(params.guidance_scale), device=self.device, dtype=torch.float32)
        no_reference = torch.zeros(0, self.num_channels, device=self.device, dtype=self.dtype)
        return [
            {
                **encoded[params.prompt],
                "guidance": guidance,
                "reference": no_reference,
                "image_ids": self._image_ids(params),
            }
        ]

    def image_conditioning(self, params: GenerationParams, images: InputImages) -> Conditioning:
        """The reference image's tokens [r, c], and the row's image ids: the noise tokens', then the reference's."""
        reference, reference_ids = self._reference(params, images.init)
        return {"reference": reference, "image_ids": torch.cat([self._image_ids(params), reference_ids])}

    def padding_row(self, params: GenerationParams) -> Conditioning:
        joint_dim = self.transformer.config.joint_attention_dim
        return {
            "embeds": torch.zeros(MAX_SEQUENCE_LENGTH, joint_dim, device=self.device, dtype=self.dtype),
            "guidance": torch.tensor(0.0, device=self.device),
            "reference": torch.zeros(0, self.num_channels, device=self.device, dtype=self.dtype),
            "image_ids": self._image_ids(params),
        }

    def model_input(self, sample: RunningSample) -> torch.Tensor:
        return sample.latents

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        conditioning = batch.conditioning
        image_ids = conditioning["image_ids"]  # [rows, max tokens, 4], zero-padded
        references = conditioning["reference"]  # [rows, max reference tokens, c], zero-padded
        num_rows = image_ids.shape[0]
        reference_lengths = batch.lengths.get("reference") or [references.shape[1]] * num_rows
        if isinstance(batch.latents, list):
            rows = [
                torch.cat([latents, reference[:length]])
                for latents, reference, length in zip(batch.latents, references, reference_lengths)
            ]
            num_noise = [latents.shape[0] for latents in batch.latents]
            hidden = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # [rows, max tokens, c]
        else:
            num_noise = [batch.latents.shape[1]] * num_rows
            hidden = batch.latents
            if references.shape[1]:
                hidden = torch.cat([hidden, references], dim=1)  # the shorter rows' references are zero-padded
        num_tokens = [noise + length for noise, length in zip(num_noise, reference_lengths)]
        is_uniform = len(set(num_tokens)) == 1 and bool((image_ids == image_ids[:1]).all())
        with contextlib.nullcontext() if is_uniform else self.attention.rows(self._row_layout(image_ids, num_tokens)):
            predictions = self.transformer(
                hidden_states=hidden.to(self.transformer.dtype),
                timestep=batch.timesteps.to(hidden.dtype) / 1000,
                guidance=conditioning["guidance"] if self.has_guidance_embeds else None,
                encoder_hidden_states=conditioning["embeds"],
                txt_ids=self.text_ids,
                img_ids=image_ids[0],  # the rows' own positions, when they differ, come from the layout
                return_dict=False,
            )[0]
        if isinstance(batch.latents, list):
            return [row[:noise] for row, noise in zip(predictions, num_noise)]
        return predictions[:, : num_noise[0]]  # the references' predictions are dropped, as the pipeline does

    def guided_prediction(self, rows: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        return rows  # guidance went into the forward

    @torch.inference_mode()
    def preview_latents(self, latents: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        height, width = self._token_grid(params)
        return latents[0].T.reshape(self.num_channels, height, width)  # [128, h/16, w/16]: normalised patches

    def decode(self, latents: torch.Tensor, params_list: Sequence[GenerationParams]) -> list[Any]:
        height, width = self._token_grid(params_list[0])
        patches = latents.transpose(1, 2).reshape(latents.shape[0], self.num_channels, height, width)
        mean, std = self._batch_norm_statistics(patches)
        patches = patches * std + mean
        channels = self.num_channels // 4  # the VAE's: unpatchify the 2x2 patches
        raw = patches.reshape(latents.shape[0], channels, 2, 2, height, width).permute(0, 1, 4, 2, 5, 3)
        raw = raw.reshape(latents.shape[0], channels, 2 * height, 2 * width)
        return pixels_to_images(self.vae.decode(raw, return_dict=False)[0])

    def _reference(self, params: GenerationParams, image: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The init image's tokens [r, c] and their ids [r, 4], as the pipeline encodes a reference image."""
        assert params.init_image is not None
        encoded = self._references.get(params.init_image)
        if encoded is None:
            encoded = self._encode_reference(image)
            self._references[params.init_image] = encoded
            while len(self._references) > NUM_CACHED_REFERENCES:
                self._references.popitem(last=False)
        self._references.move_to_end(params.init_image)
        return encoded

    @torch.inference_mode()
    def _encode_reference(self, image: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """`image`: RGB, scaled and cropped as the pipeline prepares a reference (core.image_inputs)."""
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)[None] * 2 - 1
        raw = self.vae.encode(pixels.to(self.vae.device, self.vae.dtype)).latent_dist.mode()  # [1, c/4, h, w]
        _, channels, height, width = raw.shape
        patches = raw.view(1, channels, height // 2, 2, width // 2, 2).permute(0, 1, 3, 5, 2, 4)
        patches = patches.reshape(1, channels * 4, height // 2, width // 2)
        mean, std = self._batch_norm_statistics(patches)
        tokens = ((patches - mean) / std).flatten(2).transpose(1, 2)[0]  # [r, c]
        ids = _position_ids(REFERENCE_TIME_STEP, height // 2, width // 2, 1)  # (10, row, column, 0)
        return tokens.to(self.device, self.dtype), ids.to(self.device)

    def _batch_norm_statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's latent normalisation (its batch norm's running mean and std), shaped to broadcast over `like`."""
        batch_norm = self.vae.bn
        mean = batch_norm.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(batch_norm.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps)
        return mean.to(like.device, like.dtype), std.to(like.device, like.dtype)

    def _row_layout(self, image_ids: torch.Tensor, num_tokens: list[int]) -> RowLayout:
        """This forward's layout; reused while the rows' image ids stay the same (a group's membership
        changes far less often than every step, and comparing ids costs far less than rebuilding)."""
        cached = self._layout
        if (
            cached is None
            or cached[1] != tuple(num_tokens)
            or cached[0].shape != image_ids.shape
            or not torch.equal(cached[0], image_ids)
        ):
            cached = (
                image_ids.clone(),
                tuple(num_tokens),
                row_layout(self.transformer, self.text_ids, image_ids, num_tokens),
            )
            self._layout = cached
        return cached[2]

    def _token_grid(self, params: GenerationParams) -> tuple[int, int]:
        """Rows and columns of the image's tokens: the VAE's downsampling, then 2x2 patches."""
        patch = self.vae_scale_factor * 2
        return params.height // patch, params.width // patch

    def _image_ids(self, params: GenerationParams) -> torch.Tensor:
        """[tokens, 4] positions of the noise tokens: (0, row, column, 0)."""
        return _position_ids(0, *self._token_grid(params), 1).to(self.device)

    def _num_tokens(self, params: GenerationParams) -> int:
        height, width = self._token_grid(params)
        return height * width


def _position_ids(time: int, height: int, width: int, length: int) -> torch.Tensor:
    """[height * width * length, 4] float32 ids (time, row, column, index), row-major as the pipeline builds them."""
    axes = (torch.tensor([time]), torch.arange(height), torch.arange(width), torch.arange(length))
    return torch.cartesian_prod(*axes).float()
