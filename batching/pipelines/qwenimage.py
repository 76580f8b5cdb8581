"""The Qwen-Image family behind the pipeline contract.

As `QwenImagePipeline` does it: the prompt goes into the pipeline's own template, the
Qwen2.5-VL text encoder runs on it (prompts of one call padded to the longest, with their
mask), and the last hidden states of each prompt's real tokens, less the template's
system part (`prompt_template_encode_start_idx` tokens) and cut at 512, are its
conditioning, of each prompt's own length; latents are drawn as [1, 1, 16, h/8, w/8]
from the sample's own generator and packed into 2x2 patches, [1, (h/16)*(w/16), 64];
the sampler is flow-matching Euler with the shift `mu` of the image's token count.
Guidance is true classifier-free guidance: `guidance_scale` is the pipeline's
`true_cfg_scale`, run (two rows, [cond, uncond]) only above 1 with a negative prompt,
combined as the pipeline does (CFG, then rescaled to the conditional prediction's norm
per token). Decoding undoes the VAE's per-channel latent normalisation, as the pipeline.

Rows of every size and prompt length share a forward (the family's key holds no size
outside deterministic mode): prompts are zero-padded with a mask, and rows of different
image shapes run the attention of `qwenimage_mixed_sizes` (per-row positions, padding
keys masked); rows of one shape run diffusers' attention as is. The edit model
(`qwenimage_edit`) extends this adapter: its rows carry the edit image's latents after
their own.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from diffusers.utils.torch_utils import randn_tensor

from batching.pipelines import published_latent_rgb as published
from batching.pipelines.adapter_base import AdapterBase
from batching.pipelines.contract import Conditioning, ForwardBatch, RunningSample
from batching.pipelines.flow_matching import flow_matching_sampler
from batching.pipelines.qwenimage_mixed_sizes import ImageShapes, MixedShapeQwenAttnProcessor, row_layout
from batching.pipelines.vae import pixels_to_images
from core.params import GenerationParams

MAX_SEQUENCE_LENGTH = 512  # QwenImagePipeline's default: prompt states past it are cut
TOKENIZER_MAX_LENGTH = 1024  # the pipeline's tokenizer_max_length (plus the template's system part)


class QwenImageAdapter(AdapterBase):
    family = "qwenimage"
    pipeline_classes = ("QwenImagePipeline",)
    guidance_argument = "true_cfg_scale"
    max_rows_per_sample = 2
    published_latent_rgb = published.WAN21

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.transformer = pipeline.transformer
        self.latent_channels = self.transformer.config.in_channels // 4
        self.attention = MixedShapeQwenAttnProcessor()
        # The Qwen-Image VAE keeps its causal-convolution caches on the module (clear_cache resets the encoder's
        # and the decoder's alike), so it runs one call at a time: the decoder's thread decodes while the
        # encoder's thread encodes edit images.
        self.vae_lock = threading.Lock()
        self.transformer.set_attn_processor(self.attention)
        config = self.vae.config
        shape = (1, config.z_dim, 1, 1, 1)
        self.latents_mean = torch.tensor(config.latents_mean).view(shape).to(device, self.vae.dtype)
        self.latents_std_inverse = 1.0 / torch.tensor(config.latents_std).view(shape).to(device, self.vae.dtype)

    def texts_to_encode(self, params: GenerationParams) -> list[str]:
        if self.spec.has_cfg(params.guidance_scale, params.negative_prompt):
            return [params.prompt, params.negative_prompt]
        return [params.prompt]

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        if not texts:
            return []
        pipeline = self.pipeline
        drop = pipeline.prompt_template_encode_start_idx
        tokens = pipeline.tokenizer(
            [pipeline.prompt_template_encode.format(text) for text in texts],
            max_length=TOKENIZER_MAX_LENGTH + drop,
            padding=True,
            truncation=True,
            return_tensors="pt",
        ).to(self.device)
        hidden = pipeline.text_encoder(
            input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, output_hidden_states=True
        ).hidden_states[-1]  # [n, longest, dim]
        masks = tokens.attention_mask.bool()
        return [{"embeds": row[mask][drop:][:MAX_SEQUENCE_LENGTH].to(self.dtype)} for row, mask in zip(hidden, masks)]

    def new_sampler(self, params: GenerationParams) -> Any:
        height, width = self._latent_size(params)
        num_tokens = (height // 2) * (width // 2)
        return flow_matching_sampler(
            self.pipeline.scheduler.config, params.num_inference_steps, num_tokens, self.device
        )

    def draw_noise(self, params: GenerationParams, generator: torch.Generator) -> torch.Tensor:
        height, width = self._latent_size(params)
        shape = (1, 1, self.latent_channels, height, width)  # the pipeline's: a frame axis before the channels
        noise = randn_tensor(shape, generator=generator, device=self.device, dtype=self.dtype)
        return self.pack_latents(noise.view(1, self.latent_channels, height, width))  # [1, tokens, 64]

    def initial_latents(self, params: GenerationParams, sampler: Any, generator: torch.Generator) -> torch.Tensor:
        return self.draw_noise(params, generator)

    def pack_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """[1, c, h, w] to 2x2 patches [1, (h/2)*(w/2), c*4], as QwenImagePipeline packs them."""
        _, channels, height, width = latents.shape
        packed = latents.view(1, channels, height // 2, 2, width // 2, 2).permute(0, 2, 4, 1, 3, 5)
        return packed.reshape(1, (height // 2) * (width // 2), channels * 4)

    def row_conditioning(self, params: GenerationParams, encoded: Mapping[str, Conditioning]) -> list[Conditioning]:
        shapes = self._image_shapes(params)
        rows = [{**encoded[params.prompt], "image_shapes": shapes}]
        if self.spec.has_cfg(params.guidance_scale, params.negative_prompt):
            rows.append({**encoded[params.negative_prompt], "image_shapes": shapes})  # [cond, uncond]
        return rows

    def padding_row(self, params: GenerationParams) -> Conditioning:
        """Prompt states of the longest length, so every padded forward pads its prompts alike."""
        dim = self.transformer.config.joint_attention_dim
        embeds = torch.zeros(MAX_SEQUENCE_LENGTH, dim, device=self.device, dtype=self.dtype)
        return {"embeds": embeds, "image_shapes": self._image_shapes(params)}

    def model_input(self, sample: RunningSample) -> torch.Tensor:
        return sample.latents

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        embeds = batch.conditioning["embeds"]  # [rows, longest prompt, dim], zero-padded
        num_rows = embeds.shape[0]
        text_lengths = batch.lengths.get("embeds") or [embeds.shape[1]] * num_rows
        shapes: list[ImageShapes] = [
            [(int(f), int(h), int(w)) for f, h, w in row.tolist()] for row in batch.conditioning["image_shapes"]
        ]
        latents = list(batch.latents)  # per row [tokens, 64]
        rows = self.image_tokens(latents, batch)  # per row [all image tokens, 64]
        num_tokens = [row.shape[0] for row in rows]
        hidden = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # [rows, most image tokens, 64]
        inputs: dict[str, Any] = dict(
            hidden_states=hidden, timestep=batch.timesteps.to(hidden.dtype) / 1000, encoder_hidden_states=embeds
        )
        if all(row_shapes == shapes[0] for row_shapes in shapes):  # diffusers' own attention and text mask
            if len(set(text_lengths)) > 1:
                positions = torch.arange(embeds.shape[1], device=self.device)
                inputs["encoder_hidden_states_mask"] = positions[None, :] < torch.tensor(text_lengths)[:, None].to(
                    self.device
                )
            predictions = self.transformer(**inputs, img_shapes=shapes, return_dict=False)[0]
        else:
            layout = row_layout(self.transformer, shapes, num_tokens, text_lengths)
            padded_shapes = [
                row_shapes + _padding_shape(max(num_tokens) - n) for row_shapes, n in zip(shapes, num_tokens)
            ]
            with self.attention.rows(layout):
                predictions = self.transformer(**inputs, img_shapes=padded_shapes, return_dict=False)[0]
        outputs = [row[: own.shape[0]] for row, own in zip(predictions, latents)]  # each row's own image tokens
        return outputs if isinstance(batch.latents, list) else torch.stack(outputs)

    def image_tokens(self, latents: list[torch.Tensor], batch: ForwardBatch) -> list[torch.Tensor]:
        """Each row's image-stream tokens: its latents (an edit row adds its edit image's latents)."""
        return latents

    def guided_prediction(self, rows: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        cond = rows[0:1]
        if len(rows) == 1:
            return cond
        uncond = rows[1:2]
        combined = uncond + params.guidance_scale * (cond - uncond)
        return combined * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor, params_list: Sequence[GenerationParams]) -> list[Any]:
        unpacked = self._unpack(latents, params_list[0]).unsqueeze(2).to(self.vae.dtype)  # [n, c, 1, h, w]
        raw = unpacked / self.latents_std_inverse + self.latents_mean  # as the pipeline undoes the normalisation
        with self.vae_lock:
            pixels = self.vae.decode(raw, return_dict=False)[0][:, :, 0]  # [n, 3, H, W]
        return pixels_to_images(pixels)

    def preview_latents(self, latents: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        return self._unpack(latents, params)[0]  # [16, h/8, w/8], normalised as the denoiser sees them

    def _unpack(self, latents: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        """Packed latents [n, tokens, 64] to [n, 16, h/8, w/8]."""
        height, width = self._latent_size(params)
        num = latents.shape[0]
        unpacked = latents.view(num, height // 2, width // 2, self.latent_channels, 2, 2).permute(0, 3, 1, 4, 2, 5)
        return unpacked.reshape(num, self.latent_channels, height, width)

    def _latent_size(self, params: GenerationParams) -> tuple[int, int]:
        """Latent height and width: the VAE's downsampling, rounded to whole 2x2 patches."""
        return (2 * (params.height // (self.vae_scale_factor * 2)), 2 * (params.width // (self.vae_scale_factor * 2)))

    def _image_shapes(self, params: GenerationParams) -> torch.Tensor:
        """[1, 3]: the (frames, height, width) in patches of the row's image tokens, as `img_shapes` lists them."""
        height, width = self._latent_size(params)
        return torch.tensor([[1, height // 2, width // 2]])


def _padding_shape(num_tokens: int) -> ImageShapes:
    """A shape covering `num_tokens` padding tokens, so each row's `img_shapes` sums to the padded length (the
    transformer derives per-token timestep modulation of zero_cond_t models from it)."""
    return [(1, 1, num_tokens)] if num_tokens else []
