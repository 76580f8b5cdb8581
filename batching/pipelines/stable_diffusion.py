"""The Stable Diffusion family (SD 1.x/2.x layouts) behind the engine's step contract.

The adapter splits a diffusers pipeline into the three calls the model runner makes:
encode prompts (once per job), one denoiser forward per group per step (each row with
its own timestep), and decode. A built-in model and a real checkpoint load through the
same `from_pretrained(local_files_only=True)` call; nothing is downloaded.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import torch
from PIL import Image

from batching.builtin_model import builtin_model_path, is_builtin
from batching.errors import ModelLoadError
from batching.samplers import make_sampler


class StableDiffusionAdapter:
    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model  # the name jobs must ask for: "builtin:tiny", a folder, or a repo id
        self.device = device
        self.dtype = dtype
        self.tokenizer = pipeline.tokenizer
        self.text_encoder = pipeline.text_encoder
        self.unet = pipeline.unet
        self.vae = pipeline.vae
        self.scheduler_config = pipeline.scheduler.config
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self.num_latent_channels = self.unet.config.in_channels

    @classmethod
    def load(cls, model: str, device: torch.device, dtype: torch.dtype) -> StableDiffusionAdapter:
        from diffusers import StableDiffusionPipeline

        source = str(builtin_model_path(model)) if is_builtin(model) else os.path.expanduser(model)
        if _looks_like_path(model) and not os.path.isdir(source):
            raise ModelLoadError(f"model folder {model!r} does not exist")
        try:
            with warnings.catch_warnings():  # newer diffusers renames torch_dtype; older ones know only it
                warnings.simplefilter("ignore", FutureWarning)
                pipeline = StableDiffusionPipeline.from_pretrained(
                    source,
                    torch_dtype=dtype,
                    local_files_only=True,
                    safety_checker=None,
                    feature_extractor=None,
                    requires_safety_checker=False,
                )
        except Exception as e:
            raise ModelLoadError(
                f"could not load model {model!r} from a local folder or the Hugging Face cache "
                f"(nothing is downloaded at run time): {type(e).__name__}: {e}"
            ) from e
        pipeline.to(device)
        for module in (pipeline.unet, pipeline.vae, pipeline.text_encoder):
            module.eval().requires_grad_(False)
        return cls(model, pipeline, device, dtype)

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        return (self.num_latent_channels, height // self.vae_scale_factor, width // self.vae_scale_factor)

    def new_sampler(self, name: str, num_inference_steps: int):
        return make_sampler(name, self.scheduler_config, num_inference_steps, self.device)

    @torch.inference_mode()
    def encode_prompts(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode all texts in one text-encoder call: (embeds [n, seq, dim], mask [n, seq])."""
        tokens = self.tokenizer(
            texts,
            padding="max_length",
            max_length=self.tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        )
        input_ids = tokens.input_ids.to(self.device)  # [n, seq]
        attention_mask = tokens.attention_mask.to(self.device)  # [n, seq]
        uses_mask = getattr(self.text_encoder.config, "use_attention_mask", False)
        embeds = self.text_encoder(input_ids, attention_mask=attention_mask if uses_mask else None)[0]
        return embeds.to(self.dtype), attention_mask  # [n, seq, dim]

    @torch.inference_mode()
    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """One denoiser call; row i is denoised at timesteps[i] under embeds[i]."""
        assert timesteps.shape == (latents.shape[0],)
        return self.unet(latents, timesteps, encoder_hidden_states=embeds, return_dict=False)[0]

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor) -> list[Image.Image]:
        """Latents [n, c, h, w] to n RGB images."""
        config = self.vae.config
        latents = latents.to(self.vae.dtype) / config.scaling_factor
        if getattr(config, "shift_factor", None):
            latents = latents + config.shift_factor
        pixels = self.vae.decode(latents, return_dict=False)[0]  # [n, 3, H, W] in [-1, 1]
        pixels = (pixels.float() / 2 + 0.5).clamp(0, 1)
        array = (pixels.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).cpu().numpy()
        return [Image.fromarray(np.ascontiguousarray(image)) for image in array]


def _looks_like_path(model: str) -> bool:
    """Repo ids are `org/name`; a folder is named from /, . or ~."""
    return model.startswith(("/", ".", "~"))
