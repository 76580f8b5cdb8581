"""builtin:tiny-sd3: a StableDiffusion3Pipeline with Stable Diffusion 3.5's structure at toy size.

Like SD3.5: an MMDiT transformer over 2x2 latent patches (16 VAE channels) whose joint
attention normalises queries and keys (`qk_norm="rms_norm"`, SD3.5) and whose first block
also runs SD3.5 Medium's second, image-only attention (`dual_attention_layers`); the last
block is context-pre-only, as in every SD3. Three text encoders: two CLIP encoders with
projection (their penultimate states, concatenated and zero-padded to T5's width, are the
first 77 text tokens; their pooled projections, concatenated, the pooled embedding) and a
T5 encoder (256 more tokens). The two CLIP encoders have different widths on purpose, so
code that swaps or mis-concatenates them fails loudly. The VAE has SD3's 16 latent channels,
scaling and shift; the sampler is flow-matching Euler with SD3's fixed shift of 3.
`pos_embed_max_size` covers the largest size a job may ask (core.params.MAX_SIZE).
"""

from __future__ import annotations

from batching.builtin_models.components import (
    clip_text_encoder,
    clip_tokenizer,
    seeded,
    t5_tokenizer,
    tiny_t5_encoder,
    tiny_vae,
)

CLIP_HIDDEN_SIZE = 32  # text_encoder (CLIP ViT-L's role, 768 in SD3)
CLIP_2_HIDDEN_SIZE = 64  # text_encoder_2 (OpenCLIP bigG's role, 1280)
T5_HIDDEN_SIZE = 128  # text_encoder_3 and the transformer's joint_attention_dim (4096); holds both CLIP widths
LATENT_CHANNELS = 16
PATCH_SIZE = 2
VAE_SCALING_FACTOR, VAE_SHIFT_FACTOR = 1.5305, 0.0609  # SD3's VAE
POS_EMBED_MAX_SIZE = 128  # patches per side: 128 * 2 * 8 = 2048 pixels


def build_pipeline(name: str):
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    tokenizer = clip_tokenizer()
    tokenizer_3 = t5_tokenizer()
    with seeded(0):
        transformer = SD3Transformer2DModel(
            sample_size=16,  # the pipeline's default size: 16 * 8 = 128 pixels
            patch_size=PATCH_SIZE,
            in_channels=LATENT_CHANNELS,
            num_layers=3,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=T5_HIDDEN_SIZE,
            caption_projection_dim=32,  # the transformer's width (heads x head dim)
            pooled_projection_dim=CLIP_HIDDEN_SIZE + CLIP_2_HIDDEN_SIZE,
            out_channels=LATENT_CHANNELS,
            pos_embed_max_size=POS_EMBED_MAX_SIZE,
            dual_attention_layers=(0,),  # SD3.5 Medium's MMDiT-X block
            qk_norm="rms_norm",  # SD3.5
        )
    with seeded(1):
        vae = tiny_vae(
            latent_channels=LATENT_CHANNELS,
            use_quant_conv=False,
            use_post_quant_conv=False,
            scaling_factor=VAE_SCALING_FACTOR,
            shift_factor=VAE_SHIFT_FACTOR,
        )
    with seeded(2):
        text_encoder = clip_text_encoder(tokenizer, CLIP_HIDDEN_SIZE, projection_dim=CLIP_HIDDEN_SIZE)
    with seeded(3):
        text_encoder_2 = clip_text_encoder(tokenizer, CLIP_2_HIDDEN_SIZE, projection_dim=CLIP_2_HIDDEN_SIZE)
    with seeded(4):
        text_encoder_3 = tiny_t5_encoder(tokenizer_3, T5_HIDDEN_SIZE)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)  # SD3's scheduler config
    return StableDiffusion3Pipeline(
        transformer=transformer.eval(),
        scheduler=scheduler,
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2.eval(),
        tokenizer_2=tokenizer,
        text_encoder_3=text_encoder_3.eval(),
        tokenizer_3=tokenizer_3,
    )
