"""Random-weight pipelines with the real models' structure, built from configs (nothing is downloaded).

The GPU suite measures speed, which depends on shapes, not on trained weights: an
SD-1.5-sized UNet (860 M parameters) with a CLIP ViT-L-sized text encoder and SD's VAE,
and an SDXL-sized UNet (2.6 G) with CLIP ViT-L and OpenCLIP bigG-sized encoders. The
project's tiny CLIP tokenizer stands in for the real one (token ids stay inside the
vocabulary; sequence length is CLIP's 77 as in the real models). Weights are initialised
directly on the device (fast on a GPU), cast to the run's dtype, and saved to a folder
the engine and diffusers then load like any checkpoint.

`scale="tiny"` builds the same structure with narrow widths, for the CPU dry run.
FLUX is too large to save and load within the time (12 G transformer plus a 4.7 G T5):
the suite times its transformer alone (`flux_transformer`), as it times a Wan 2.1 1.3B-sized
video transformer (`wan_transformer`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from batching.builtin_models.components import clip_text_config, clip_tokenizer

SD_VAE = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32)
TINY_VAE = dict(block_out_channels=(16, 32, 64, 64), layers_per_block=1, norm_num_groups=16)
CLIP_L = dict(hidden=768, layers=12, heads=12)  # CLIP ViT-L's text encoder
OPEN_CLIP_BIG_G = dict(hidden=1280, layers=32, heads=20)  # OpenCLIP bigG's


def _unet(channels: tuple[int, ...], head_dim: int | tuple[int, ...], layers: int | tuple[int, ...], context: int):
    """A UNet size: channels per level, attention head dim and transformer layers (per level or for all), and the
    cross-attention width."""
    return dict(
        block_out_channels=channels,
        attention_head_dim=head_dim,
        transformer_layers_per_block=layers,
        cross_attention_dim=context,
    )


SIZES = {
    ("sd15", "real"): dict(unet=_unet((320, 640, 1280, 1280), 8, 1, 768), text=[CLIP_L], vae=SD_VAE),
    ("sd15", "tiny"): dict(
        unet=_unet((32, 32, 64, 64), 8, 1, 32), text=[dict(hidden=32, layers=2, heads=4)], vae=TINY_VAE
    ),
    ("sdxl", "real"): dict(
        unet=_unet((320, 640, 1280), (5, 10, 20), (1, 2, 10), 2048), text=[CLIP_L, OPEN_CLIP_BIG_G], vae=SD_VAE
    ),
    ("sdxl", "tiny"): dict(
        unet=_unet((32, 64, 64), (2, 4, 4), (1, 1, 2), 96),
        text=[dict(hidden=32, layers=2, heads=4), dict(hidden=64, layers=2, heads=4)],
        vae=TINY_VAE,
    ),
}


def _flux(layers: int, single_layers: int, head_dim: int, heads: int, text_width: int, pooled_width: int, **extra):
    """A FluxTransformer2DModel size: double- and single-stream blocks, attention, and the T5 and CLIP widths."""
    return dict(
        num_layers=layers,
        num_single_layers=single_layers,
        attention_head_dim=head_dim,
        num_attention_heads=heads,
        joint_attention_dim=text_width,
        pooled_projection_dim=pooled_width,
        **extra,
    )


FLUX = {"real": _flux(19, 38, 128, 24, 4096, 768), "tiny": _flux(1, 1, 16, 2, 32, 32, axes_dims_rope=(4, 6, 6))}


def _wan(layers: int, heads: int, head_dim: int, ffn: int, text_width: int) -> dict:
    """A WanTransformer3DModel size: blocks, attention, MLP width and the UMT5 width it cross-attends to."""
    return dict(
        num_layers=layers, num_attention_heads=heads, attention_head_dim=head_dim, ffn_dim=ffn, text_dim=text_width
    )


# Wan 2.1 T2V 1.3B's transformer (30 blocks of 12 x 128); the 14B's is 40 blocks of 40 x 128, ffn 13824
WAN = {"real": _wan(30, 12, 128, 8960, 4096), "tiny": _wan(2, 2, 12, 48, 32)}


def save_pipeline(family: str, scale: str, folder: Path, device: torch.device, dtype: torch.dtype) -> Path:
    """Build `family` ("sd15" or "sdxl") at `scale` on `device` in `dtype` and save it to `folder`."""
    pipeline = _build(family, SIZES[(family, scale)], device)
    pipeline.to(dtype=dtype)
    pipeline.save_pretrained(folder)
    del pipeline
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return folder


def num_parameters(folder: Path) -> dict[str, int]:
    from safetensors import safe_open

    counts: dict[str, int] = {}
    for path in sorted(Path(folder).glob("*/*.safetensors")):
        with safe_open(str(path), "pt") as file:
            total = sum(_numel(file.get_slice(name).get_shape()) for name in file.keys())
        counts[path.parent.name] = counts.get(path.parent.name, 0) + total
    return counts


def flux_transformer(scale: str, device: torch.device, dtype: torch.dtype):
    from diffusers import FluxTransformer2DModel

    with torch.device(device):
        model: Any = FluxTransformer2DModel(in_channels=64, guidance_embeds=True, **FLUX[scale])
    return model.to(dtype=dtype).eval().requires_grad_(False)


def wan_transformer(scale: str, device: torch.device, dtype: torch.dtype):
    from diffusers import WanTransformer3DModel

    with torch.device(device):
        model: Any = WanTransformer3DModel(patch_size=(1, 2, 2), in_channels=16, out_channels=16, **WAN[scale])
    model = model.to(dtype=dtype)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:  # float32, as from_pretrained keeps them
        if any(key in name.split(".") for key in WanTransformer3DModel._keep_in_fp32_modules):
            tensor.data = tensor.data.float()
    return model.eval().requires_grad_(False)


def _numel(shape) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def _build(family: str, size: dict, device: torch.device):
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        EulerDiscreteScheduler,
        StableDiffusionPipeline,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    tokenizer = clip_tokenizer()
    unet_size = size["unet"]
    levels = len(unet_size["block_out_channels"])
    is_xl = family == "sdxl"
    if is_xl:  # SDXL: no attention at the top level
        down = ("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (levels - 1)
        up = ("CrossAttnUpBlock2D",) * (levels - 1) + ("UpBlock2D",)
    else:  # SD 1.5: no attention at the bottom level
        down = ("CrossAttnDownBlock2D",) * (levels - 1) + ("DownBlock2D",)
        up = ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (levels - 1)
    xl_extra = (
        dict(
            addition_embed_type="text_time",
            addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=6 * 256 + size["text"][-1]["hidden"],
            use_linear_projection=True,
        )
        if is_xl
        else {}
    )

    def text_config(text: dict, **extra) -> CLIPTextConfig:
        return clip_text_config(tokenizer, text["hidden"], text["layers"], text["heads"], mlp_ratio=4, **extra)

    init = torch.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with init:
        unet = UNet2DConditionModel(
            sample_size=128 if is_xl else 64,
            in_channels=4,
            out_channels=4,
            layers_per_block=2,
            down_block_types=down,
            up_block_types=up,
            **unet_size,
            **xl_extra,
        )
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            latent_channels=4,
            sample_size=1024 if is_xl else 512,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            scaling_factor=0.13025 if is_xl else 0.18215,
            **size["vae"],
        )
        text_encoder = CLIPTextModel(text_config(size["text"][0]))
        if is_xl:
            last = size["text"][-1]
            text_encoder_2 = CLIPTextModelWithProjection(text_config(last, projection_dim=last["hidden"]))
    schedule = dict(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        steps_offset=1,
        prediction_type="epsilon",
    )
    if is_xl:
        return StableDiffusionXLPipeline(
            vae=vae,
            text_encoder=text_encoder,
            text_encoder_2=text_encoder_2,
            tokenizer=tokenizer,
            tokenizer_2=tokenizer,
            unet=unet,
            scheduler=EulerDiscreteScheduler(timestep_spacing="leading", **schedule),
            force_zeros_for_empty_prompt=True,
            add_watermarker=False,
        )
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=DDIMScheduler(clip_sample=False, set_alpha_to_one=False, **schedule),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
