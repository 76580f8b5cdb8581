"""builtin:tiny-zimage: a ZImagePipeline with Z-Image-Turbo's structure at toy size.

Like Z-Image: a single-stream transformer over 2x2 latent patches (16 VAE channels) and
the caption tokens, which are the penultimate hidden states of a Qwen3 text encoder
run on the prompt wrapped in Qwen3's chat template; FLUX's VAE scaling and shift; a
flow-matching Euler sampler with a fixed shift of 3. The Qwen tokenizer is generated
by `training/tokenizers/make_qwen_tokenizer.py`.
"""

from __future__ import annotations

from batching.builtin_models.components import (
    FLUX_LATENT_CHANNELS,
    qwen_tokenizer,
    seeded,
    tiny_flux_vae,
    tiny_qwen3_config,
)

TEXT_HIDDEN_SIZE = 32  # the caption features' width (Z-Image: 2560)
TRANSFORMER_DIM = 64
NUM_HEADS = 2
ROPE_AXES_DIMS = (8, 12, 12)  # Z-Image's (32, 48, 48) scaled down; sums to the head dim
ROPE_AXES_LENS = (1536, 512, 512)  # Z-Image's: caption/frame, height and width positions
FLOW_SHIFT = 3.0  # Z-Image-Turbo's fixed shift, the same at every size


def build_pipeline(name: str):
    from diffusers import ZImagePipeline
    from transformers import Qwen3Model

    tokenizer = qwen_tokenizer()
    with seeded(0):
        transformer = zimage_transformer(FLUX_LATENT_CHANNELS, TRANSFORMER_DIM, 2, NUM_HEADS, TEXT_HIDDEN_SIZE)
    with seeded(1):
        vae = tiny_flux_vae()
    with seeded(2):
        text_encoder = Qwen3Model(tiny_qwen3_config(tokenizer, TEXT_HIDDEN_SIZE, head_dim=8))
    return ZImagePipeline(
        scheduler=zimage_scheduler(),
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        transformer=transformer.eval(),
    )


def zimage_transformer(in_channels: int, dim: int, num_layers: int, num_heads: int, caption_width: int):
    """Z-Image's single-stream transformer over 2x2 latent patches and caption tokens, at a toy size."""
    from diffusers import ZImageTransformer2DModel

    assert sum(ROPE_AXES_DIMS) == dim // num_heads
    return ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=in_channels,
        dim=dim,
        n_layers=num_layers,
        n_refiner_layers=1,
        n_heads=num_heads,
        n_kv_heads=num_heads,
        norm_eps=1e-5,
        qk_norm=True,
        cap_feat_dim=caption_width,
        rope_theta=256.0,
        t_scale=1000.0,
        axes_dims=list(ROPE_AXES_DIMS),
        axes_lens=list(ROPE_AXES_LENS),
    )


def zimage_scheduler():
    """Z-Image-Turbo's scheduler config: flow matching with a fixed shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=FLOW_SHIFT, use_dynamic_shifting=False)
