"""The FLUX.1 family (dev and schnell) behind the pipeline contract.

As `FluxPipeline` does it: latents are drawn as [1, 16, h/8, w/8] from the sample's own
generator and packed into 2x2 patches, [1, (h/16)*(w/16), 64]; the text conditioning is
CLIP's pooled embedding plus T5's per-token states (padded to `max_sequence_length`); the
sampler is flow-matching Euler whose shift `mu` grows with the image's token count.
FLUX-dev is guidance-distilled: one row per sample, the guidance value a per-row model
input (so samples with different guidance share a forward); schnell has no guidance
embedder and ignores it. Outside deterministic mode a group mixes sizes: each row
carries its own image position ids, and a forward over rows of different sizes pads
their image tokens and runs the attention of `flux_mixed_sizes` (per-row positions,
padding keys masked); a forward over rows of one size runs diffusers' attention as is.
Step caching is First-Block Cache (`batching.pipelines.flux_step_cache`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from diffusers.utils.torch_utils import randn_tensor

from batching.pipelines import published_latent_rgb as published
from batching.pipelines.adapter_base import AdapterBase, tokenize
from batching.pipelines.contract import CachedForward, CachedSample, Conditioning, ForwardBatch, RunningSample
from batching.pipelines.flow_matching import flow_matching_sampler
from batching.pipelines.flux_mixed_sizes import MixedSizeFluxAttnProcessor, RowLayout, row_layout
from batching.pipelines.flux_step_cache import first_block_cached_forward
from batching.pipelines.vae import decode_latents
from core.params import GenerationParams

MAX_SEQUENCE_LENGTH = 512  # FluxPipeline's default T5 length


class FluxAdapter(AdapterBase):
    family = "flux"
    pipeline_classes = ("FluxPipeline",)
    max_rows_per_sample = 1
    published_latent_rgb = published.FLUX1

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.transformer = pipeline.transformer
        self.has_guidance_embeds = bool(self.transformer.config.guidance_embeds)
        self.attention = MixedSizeFluxAttnProcessor()
        self._layout: tuple[torch.Tensor, tuple, RowLayout] | None = None  # the last mixed-size layout, built from
        self.transformer.set_attn_processor(self.attention)
        self.num_cache_blocks = len(self.transformer.transformer_blocks) + len(
            self.transformer.single_transformer_blocks
        )
        self.num_blocks_kept = 1  # First-Block Cache (flux_step_cache): the first double-stream block decides

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        pipeline = self.pipeline
        clip_ids = tokenize(pipeline.tokenizer, texts).input_ids.to(self.device)  # [n, 77]
        pooled = pipeline.text_encoder(clip_ids, output_hidden_states=False).pooler_output  # [n, clip_dim]
        t5_ids = tokenize(pipeline.tokenizer_2, texts, MAX_SEQUENCE_LENGTH).input_ids.to(self.device)  # [n, 512]
        embeds = pipeline.text_encoder_2(t5_ids, output_hidden_states=False)[0]  # [n, 512, t5_dim]
        return [{"embeds": row.to(self.dtype), "pooled": pool.to(self.dtype)} for row, pool in zip(embeds, pooled)]

    def new_sampler(self, params: GenerationParams) -> Any:
        config = self.pipeline.scheduler.config
        return flow_matching_sampler(config, params.num_inference_steps, self._num_tokens(params), self.device)

    def draw_noise(self, params: GenerationParams, generator: torch.Generator) -> torch.Tensor:
        channels = self.transformer.config.in_channels // 4
        height, width = self._latent_size(params)
        noise = randn_tensor((1, channels, height, width), generator=generator, device=self.device, dtype=self.dtype)
        return self.pack_latents(noise)  # [1, tokens, 64]

    def initial_latents(self, params: GenerationParams, sampler: Any, generator: torch.Generator) -> torch.Tensor:
        return self.draw_noise(params, generator)

    def pack_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """[1, c, h, w] to 2x2 patches [1, (h/2)*(w/2), c*4], as FluxPipeline packs them."""
        _, channels, height, width = latents.shape
        packed = latents.view(1, channels, height // 2, 2, width // 2, 2).permute(0, 2, 4, 1, 3, 5)
        return packed.reshape(1, (height // 2) * (width // 2), channels * 4)

    def row_conditioning(self, params: GenerationParams, encoded: Mapping[str, Conditioning]) -> list[Conditioning]:
        guidance = torch.tensor(float(params.guidance_scale), device=self.device, dtype=torch.float32)
        return [{**encoded[params.prompt], "guidance": guidance, "image_ids": self._image_ids(params)}]

    def padding_row(self, params: GenerationParams) -> Conditioning:
        config = self.transformer.config
        zeros: dict[str, Any] = dict(device=self.device, dtype=self.dtype)
        return {
            "embeds": torch.zeros(MAX_SEQUENCE_LENGTH, config.joint_attention_dim, **zeros),
            "pooled": torch.zeros(config.pooled_projection_dim, **zeros),
            "guidance": torch.tensor(0.0, device=self.device),
            "image_ids": self._image_ids(params),
        }

    def model_input(self, sample: RunningSample) -> torch.Tensor:
        return sample.latents

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        latents, num_tokens, inputs = self._transformer_inputs(batch)
        with self._layout_of(inputs, num_tokens)(list(range(len(num_tokens)))):
            predictions = self.transformer(
                hidden_states=latents,
                timestep=inputs["timestep"],
                guidance=inputs["guidance"],
                pooled_projections=inputs["pooled"],
                encoder_hidden_states=inputs["embeds"],
                txt_ids=inputs["text_ids"],
                img_ids=inputs["img_ids"],  # the rows' own positions, when they differ, come from the layout
                return_dict=False,
            )[0]
        return self._predictions(batch, predictions, num_tokens)

    @torch.inference_mode()
    def forward_cached(
        self, batch: ForwardBatch, samples: Sequence[CachedSample], *, may_gather: bool
    ) -> CachedForward:
        latents, num_tokens, inputs = self._transformer_inputs(batch)
        layout_of = self._layout_of(inputs, num_tokens)
        predictions, skipped = first_block_cached_forward(
            self.transformer, latents, num_tokens, inputs, samples, layout_of, may_gather=may_gather
        )
        return CachedForward(self._predictions(batch, predictions, num_tokens), skipped)

    def _transformer_inputs(self, batch: ForwardBatch) -> tuple[torch.Tensor, list[int], dict[str, Any]]:
        embeds = batch.conditioning["embeds"]  # [rows, 512, t5_dim]
        image_ids = batch.conditioning["image_ids"]  # [rows, max tokens, 3], zero-padded
        if isinstance(batch.latents, list):  # sizes differ: pad the image tokens, mask the padding
            num_tokens = [row.shape[0] for row in batch.latents]
            latents = torch.nn.utils.rnn.pad_sequence(batch.latents, batch_first=True)  # [rows, max tokens, 64]
        else:
            num_tokens, latents = [batch.latents.shape[1]] * batch.latents.shape[0], batch.latents
        inputs = {
            "timestep": batch.timesteps.to(latents.dtype) / 1000,
            "guidance": batch.conditioning["guidance"] if self.has_guidance_embeds else None,
            "pooled": batch.conditioning["pooled"],
            "embeds": embeds,
            "text_ids": torch.zeros(embeds.shape[1], 3, device=self.device, dtype=self.dtype),
            "img_ids": image_ids[0],
            "image_ids": image_ids,
        }
        return latents, num_tokens, inputs

    def _layout_of(self, inputs: dict[str, Any], num_tokens: list[int]):
        """Batch rows -> the attention layout of a forward over them (none when the batch is of one size)."""
        image_ids, text_ids = inputs["image_ids"], inputs["text_ids"]
        is_uniform = bool((image_ids == image_ids[:1]).all())  # 128x192 and 192x128 have equal token counts

        def layout_of(rows: list[int]) -> contextlib.AbstractContextManager:
            if is_uniform:
                return contextlib.nullcontext()
            if len(rows) == len(num_tokens):
                return self.attention.rows(self._row_layout(text_ids, image_ids, num_tokens))
            layout = row_layout(self.transformer, text_ids, image_ids[rows], [num_tokens[row] for row in rows])
            return self.attention.rows(layout)

        return layout_of

    def _predictions(self, batch: ForwardBatch, predictions: torch.Tensor, num_tokens: list[int]):
        if isinstance(batch.latents, list):
            return [row[:tokens] for row, tokens in zip(predictions, num_tokens)]
        return predictions

    def _row_layout(self, text_ids: torch.Tensor, image_ids: torch.Tensor, num_tokens: list[int]) -> RowLayout:
        """This forward's layout; reused while the rows' image ids stay the same (a group's membership
        changes far less often than every step, and comparing ids costs far less than rebuilding)."""
        cached = self._layout
        if (
            cached is None
            or cached[1] != (tuple(num_tokens), text_ids.shape[0])
            or cached[0].shape != image_ids.shape
            or not torch.equal(cached[0], image_ids)
        ):
            cached = (
                image_ids.clone(),
                (tuple(num_tokens), text_ids.shape[0]),
                row_layout(self.transformer, text_ids, image_ids, num_tokens),
            )
            self._layout = cached
        return cached[2]

    def guided_prediction(self, rows: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        return rows  # guidance went into the forward

    def decode(self, latents: torch.Tensor, params_list: Sequence[GenerationParams]) -> list[Any]:
        return decode_latents(self.vae, self._unpack(latents, params_list[0]))

    def preview_latents(self, latents: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        return self._unpack(latents, params)[0]  # [16, h/8, w/8]

    def _unpack(self, latents: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        """Packed latents [n, tokens, 64] to the VAE's layout [n, 16, h/8, w/8]."""
        height, width = self._latent_size(params)
        channels = latents.shape[2] // 4
        unpacked = latents.view(latents.shape[0], height // 2, width // 2, channels, 2, 2).permute(0, 3, 1, 4, 2, 5)
        return unpacked.reshape(latents.shape[0], channels, height, width)

    def _latent_size(self, params: GenerationParams) -> tuple[int, int]:
        """Latent height and width: the VAE's downsampling, rounded to whole 2x2 patches."""
        return (2 * (params.height // (self.vae_scale_factor * 2)), 2 * (params.width // (self.vae_scale_factor * 2)))

    def _image_ids(self, params: GenerationParams) -> torch.Tensor:
        """[tokens, 3] positions of the packed latent tokens: (0, row, column)."""
        height, width = (size // 2 for size in self._latent_size(params))
        ids = torch.zeros(height, width, 3)
        ids[..., 1] += torch.arange(height)[:, None]
        ids[..., 2] += torch.arange(width)[None, :]
        return ids.reshape(height * width, 3).to(self.device, self.dtype)

    def _num_tokens(self, params: GenerationParams) -> int:
        height, width = self._latent_size(params)
        return (height // 2) * (width // 2)
