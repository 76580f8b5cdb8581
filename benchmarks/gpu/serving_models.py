"""The serving suite's models: every family's diffusers pipeline with random weights, built in memory on the device.

Nothing is downloaded or written to disk (a FLUX.1 or Qwen-Image checkpoint is tens of GB: saving and
loading it would take the run's minutes). Speed depends on shapes, not on trained weights, so at
`scale="real"` each denoiser has its checkpoint's structure and size (from its diffusers config), and so does
each VAE; the text encoders keep their real width (what the denoiser cross-attends to) but only two layers
(CLIP ViT-L keeps all twelve): a job's prompt is encoded once, its denoiser runs every step. The
tokenizers are the project's tiny offline ones (token ids stay in the vocabulary; sequence lengths are the
pipelines' own). The denoisers of the transformer families are built in bfloat16, the UNet families in
float16, as their checkpoints run. At `scale="tiny"` (the CPU dry run) the built-in models' own builders
are used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from batching.builtin_models.components import (
    FLUX_VAE_SCALING_FACTOR,
    FLUX_VAE_SHIFT_FACTOR,
    clip_text_config,
    clip_tokenizer,
    flux_scheduler,
    qwen_tokenizer,
    t5_tokenizer,
)
from benchmarks.gpu.models import SIZES, _build

TINY_BUILTINS = {  # family -> the built-in whose builder makes its tiny pipeline
    "flux": ("batching.pipelines.flux.builtin", "tiny-flux"),
    "qwenimage": ("batching.pipelines.qwenimage.builtin", "tiny-qwen-image"),
    "wan": ("batching.pipelines.wan.builtin", "tiny-wan"),
    "zimage": ("batching.pipelines.zimage.builtin", "tiny-zimage"),
    "sd3": ("batching.pipelines.sd3.builtin", "tiny-sd3"),
    "flux2": ("batching.pipelines.flux2.builtin", "tiny-flux2"),
}
# family -> GiB of device memory its real-size build needs (weights and a forward at the suite's size)
REAL_MEMORY_GIB = {"sd15": 8, "sdxl": 16, "flux": 45, "qwenimage": 60, "wan": 30, "zimage": 30, "sd3": 30}


@dataclass
class BuiltModel:
    pipeline: Any  # the family's diffusers pipeline, on the device
    dtype: torch.dtype  # what its denoiser computes in (the engine's adapter is built with it)


def build_model(name: str, scale: str, device: torch.device) -> BuiltModel:
    """`name`: the suite's family name (sd15, sdxl, flux, qwenimage, wan, zimage, sd3)."""
    if name in ("sd15", "sdxl"):
        dtype = torch.float16 if scale == "real" else torch.float32
        pipeline = _build(name, SIZES[(name, scale)], device)
        return BuiltModel(pipeline.to(device=device, dtype=dtype), dtype)
    if scale == "tiny":
        import importlib

        module, builtin = TINY_BUILTINS[name]
        return BuiltModel(importlib.import_module(module).build_pipeline(builtin).to(device), torch.float32)
    pipeline = REAL_BUILDERS[name](lambda: _building(device, torch.bfloat16))
    for component in pipeline.components.values():  # inference mode of every module (dropout, norms)
        if isinstance(component, torch.nn.Module):
            component.eval()
    if name == "wan":  # the modules diffusers keeps in float32, as from_pretrained keeps them
        keep = type(pipeline.transformer)._keep_in_fp32_modules or []
        for module_name, module in pipeline.transformer.named_modules():
            if any(part in keep for part in module_name.split(".")):
                module.float()
    return BuiltModel(pipeline.to(device), torch.bfloat16)


Place = Callable[[], contextlib.AbstractContextManager]  # a block in which modules are built on the device


@contextlib.contextmanager
def _building(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Modules constructed in the body are created on `device` in `dtype` (a 12 G-parameter transformer built in
    float32 first would not fit beside its bfloat16 copy). Schedulers and tokenizers are made outside it: a
    scheduler computes its tables with numpy from tensors it expects on the CPU."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), torch.no_grad():
            yield
    finally:
        torch.set_default_dtype(previous)


def _t5_fields(tokenizer: Any, d_model: int = 4096) -> dict[str, Any]:
    """T5-XXL's encoder width and attention (FLUX's, SD3's; Wan's UMT5 is the same shape), two layers."""
    return dict(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=64,
        d_ff=10240,
        num_layers=2,
        num_heads=64,
        feed_forward_proj="gated-gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )


def _t5(tokenizer: Any, d_model: int = 4096) -> Any:
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(**_t5_fields(tokenizer, d_model))).eval()


def _clip(tokenizer: Any, hidden: int, layers: int, heads: int, projection: bool = False) -> Any:
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    if projection:
        config = clip_text_config(tokenizer, hidden, layers, heads, mlp_ratio=4, projection_dim=hidden)
        return CLIPTextModelWithProjection(config).eval()
    return CLIPTextModel(clip_text_config(tokenizer, hidden, layers, heads, mlp_ratio=4)).eval()


def _kl_vae(latent_channels: int, scaling: float, shift: float) -> Any:
    """The 16-channel KL VAE of FLUX.1, Z-Image and SD3 (no quant convs), at its real size."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512),
        layers_per_block=2,
        latent_channels=latent_channels,
        norm_num_groups=32,
        use_quant_conv=False,
        use_post_quant_conv=False,
        scaling_factor=scaling,
        shift_factor=shift,
    )


def _flux(place: Place) -> Any:
    """FLUX.1-dev: 19 double- and 38 single-stream blocks of 24 x 128, guidance-distilled (12 G parameters)."""
    from diffusers import FluxPipeline, FluxTransformer2DModel

    tokenizer, tokenizer_2, scheduler = clip_tokenizer(), t5_tokenizer(), flux_scheduler()
    with place():
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=64,
            num_layers=19,
            num_single_layers=38,
            attention_head_dim=128,
            num_attention_heads=24,
            joint_attention_dim=4096,
            pooled_projection_dim=768,
            guidance_embeds=True,
            axes_dims_rope=(16, 56, 56),
        )
        modules = dict(
            vae=_kl_vae(16, FLUX_VAE_SCALING_FACTOR, FLUX_VAE_SHIFT_FACTOR),
            text_encoder=_clip(tokenizer, 768, 12, 12),
            text_encoder_2=_t5(tokenizer_2),
        )
    return FluxPipeline(
        scheduler=scheduler, tokenizer=tokenizer, tokenizer_2=tokenizer_2, transformer=transformer, **modules
    )


def _qwenimage(place: Place) -> Any:
    """Qwen-Image: 60 double-stream blocks of 24 x 128 over Qwen2.5-VL-7B's 3584-wide states (20 G parameters)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

    from batching.pipelines.qwenimage.builtin import QWEN_VL_TOKENIZER_DIR

    tokenizer = Qwen2Tokenizer.from_pretrained(QWEN_VL_TOKENIZER_DIR)
    token = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 2,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": None,
        },
        vision_config={  # text-to-image never runs it (the edit pipelines do)
            "depth": 2,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": 3584,
            "fullatt_block_indexes": [1],
        },
        image_token_id=token("<|image_pad|>"),
        video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"),
        vision_end_token_id=token("<|vision_end|>"),
    )
    scheduler = FlowMatchEulerDiscreteScheduler(  # Qwen-Image's scheduler config
        num_train_timesteps=1000,
        shift=1.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=0.9,
        base_image_seq_len=256,
        max_image_seq_len=8192,
        shift_terminal=0.02,
        time_shift_type="exponential",
    )
    with place():  # the class defaults are Qwen-Image's transformer and VAE
        modules = dict(
            vae=AutoencoderKLQwenImage(),
            text_encoder=Qwen2_5_VLForConditionalGeneration(config),
            transformer=QwenImageTransformer2DModel(),
        )
    return QwenImagePipeline(scheduler=scheduler, tokenizer=tokenizer, **modules)


def _wan(place: Place) -> Any:
    """Wan 2.1 T2V 1.3B: 30 blocks of 12 x 128 over UMT5-XXL's 4096-wide states, Wan's VAE, UniPC (shift 3)."""
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from batching.pipelines.wan.builtin import _scheduler, umt5_tokenizer

    tokenizer, scheduler = umt5_tokenizer(), _scheduler(3.0)
    config = UMT5Config(**_t5_fields(tokenizer))
    with place():
        modules = dict(
            text_encoder=UMT5EncoderModel(config),
            vae=AutoencoderKLWan(),  # the class defaults are Wan 2.1's VAE
            transformer=WanTransformer3DModel(
                num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, num_layers=30, text_dim=4096
            ),
        )
    return WanPipeline(tokenizer=tokenizer, scheduler=scheduler, **modules)


def _zimage(place: Place) -> Any:
    """Z-Image-Turbo: 30 single-stream blocks of 3840 over Qwen3-4B's 2560-wide states (6 G parameters)."""
    from diffusers import ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    from batching.pipelines.zimage.builtin import zimage_scheduler

    tokenizer, scheduler = qwen_tokenizer(), zimage_scheduler()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=2,  # Z-Image reads the penultimate layer's states
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=tokenizer.model_max_length,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with place():  # the class defaults are Z-Image's transformer
        modules = dict(
            vae=_kl_vae(16, FLUX_VAE_SCALING_FACTOR, FLUX_VAE_SHIFT_FACTOR),
            text_encoder=Qwen3Model(config),
            transformer=ZImageTransformer2DModel(),
        )
    return ZImagePipeline(scheduler=scheduler, tokenizer=tokenizer, **modules)


def _sd3(place: Place) -> Any:
    """Stable Diffusion 3.5 Large: 38 MMDiT blocks of 38 x 64 (8 G parameters), CLIP-L, CLIP-G and T5-XXL widths."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    tokenizer, tokenizer_3 = clip_tokenizer(), t5_tokenizer()
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    with place():
        transformer = SD3Transformer2DModel(
            sample_size=128,
            patch_size=2,
            in_channels=16,
            num_layers=38,
            attention_head_dim=64,
            num_attention_heads=38,
            joint_attention_dim=4096,
            caption_projection_dim=2432,
            pooled_projection_dim=2048,
            out_channels=16,
            pos_embed_max_size=192,
            qk_norm="rms_norm",
        )
        modules = dict(
            vae=_kl_vae(16, 1.5305, 0.0609),
            text_encoder=_clip(tokenizer, 768, 12, 12, projection=True),
            text_encoder_2=_clip(tokenizer, 1280, 2, 20, projection=True),
            text_encoder_3=_t5(tokenizer_3),
        )
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=scheduler,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        tokenizer_3=tokenizer_3,
        **modules,
    )


REAL_BUILDERS = {"flux": _flux, "qwenimage": _qwenimage, "wan": _wan, "zimage": _zimage, "sd3": _sd3}
