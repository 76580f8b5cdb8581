"""builtin:tiny-zimage: a ZImagePipeline with Z-Image-Turbo's structure at toy size.

Like Z-Image: a single-stream transformer over 2x2 latent patches (16 VAE channels) and
the caption tokens, which are the penultimate hidden states of a Qwen3 text encoder
run on the prompt wrapped in Qwen3's chat template; FLUX's VAE scaling and shift; a
flow-matching Euler sampler with a fixed shift of 3. The Qwen tokenizer is generated
by `training/tokenizers/make_qwen_tokenizer.py`.
"""

from __future__ import annotations

from batching.builtin_models.components import (
    ASSETS_DIR,
    FLUX_LATENT_CHANNELS,
    seeded,
    tiny_flux_vae,
    tiny_qwen3_config,
)

QWEN_TOKENIZER_DIR = ASSETS_DIR / "tiny-qwen-tokenizer"
TEXT_HIDDEN_SIZE = 32  # the caption features' width (Z-Image: 2560)
TRANSFORMER_DIM = 64
NUM_HEADS = 2
ROPE_AXES_DIMS = (8, 12, 12)  # Z-Image's (32, 48, 48) scaled down; sums to the head dim
ROPE_AXES_LENS = (1536, 512, 512)  # Z-Image's: caption/frame, height and width positions
LATENT_CHANNELS = FLUX_LATENT_CHANNELS


def build_pipeline(name: str):
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen2Tokenizer, Qwen3Model

    tokenizer = Qwen2Tokenizer.from_pretrained(QWEN_TOKENIZER_DIR)
    assert sum(ROPE_AXES_DIMS) == TRANSFORMER_DIM // NUM_HEADS
    with seeded(0):
        transformer = ZImageTransformer2DModel(
            all_patch_size=(2,),
            all_f_patch_size=(1,),
            in_channels=LATENT_CHANNELS,
            dim=TRANSFORMER_DIM,
            n_layers=2,
            n_refiner_layers=1,
            n_heads=NUM_HEADS,
            n_kv_heads=NUM_HEADS,
            norm_eps=1e-5,
            qk_norm=True,
            cap_feat_dim=TEXT_HIDDEN_SIZE,
            rope_theta=256.0,
            t_scale=1000.0,
            axes_dims=list(ROPE_AXES_DIMS),
            axes_lens=list(ROPE_AXES_LENS),
        )
    with seeded(1):
        vae = tiny_flux_vae()
    with seeded(2):
        text_encoder = Qwen3Model(tiny_qwen3_config(tokenizer, TEXT_HIDDEN_SIZE, head_dim=8))
    scheduler = FlowMatchEulerDiscreteScheduler(  # Z-Image-Turbo's scheduler config
        num_train_timesteps=1000,
        shift=3.0,
        use_dynamic_shifting=False,
    )
    return ZImagePipeline(
        scheduler=scheduler,
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        transformer=transformer.eval(),  # type: ignore[attr-defined]  # mypy reads diffusers' torch-less dummy class
    )
