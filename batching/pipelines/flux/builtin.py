"""builtin:tiny-flux: a FluxPipeline with FLUX.1-dev's structure at toy size.

Like FLUX.1-dev: the transformer takes 2x2-packed latents (16 VAE channels x 4 = 64 per
token), embeds the guidance value (`guidance_embeds=True`, guidance-distilled), reads
the CLIP encoder's pooled output and the T5 encoder's per-token states; the VAE has 16
latent channels with FLUX's scaling and shift; the sampler is flow-matching Euler whose
shift grows with the image's token count. The T5 tokenizer and encoder are the shared tiny ones
(`batching.builtin_models.components`).
"""

from __future__ import annotations

from batching.builtin_models.components import (
    FLUX_LATENT_CHANNELS,
    clip_text_encoder,
    clip_tokenizer,
    flux_scheduler,
    seeded,
    t5_tokenizer,
    tiny_flux_vae,
    tiny_t5_encoder,
)

CLIP_HIDDEN_SIZE = 32  # the pooled projection's width (FLUX: 768)
T5_HIDDEN_SIZE = 64  # the per-token states' width (FLUX: 4096)
LATENT_CHANNELS = FLUX_LATENT_CHANNELS
PATCH_TOKENS = 2 * 2  # latents are packed into 2x2 patches
ATTENTION_HEAD_DIM = 16
ROPE_AXES_DIMS = (4, 6, 6)  # FLUX's (16, 56, 56) scaled down; sums to the head dim


def build_pipeline(name: str):
    from diffusers import FluxPipeline, FluxTransformer2DModel

    tokenizer = clip_tokenizer()
    tokenizer_2 = t5_tokenizer()
    assert sum(ROPE_AXES_DIMS) == ATTENTION_HEAD_DIM
    with seeded(0):
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=LATENT_CHANNELS * PATCH_TOKENS,
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=ATTENTION_HEAD_DIM,
            num_attention_heads=2,
            joint_attention_dim=T5_HIDDEN_SIZE,
            pooled_projection_dim=CLIP_HIDDEN_SIZE,
            guidance_embeds=True,
            axes_dims_rope=ROPE_AXES_DIMS,
        )
    with seeded(1):
        vae = tiny_flux_vae()
    with seeded(2):
        text_encoder = clip_text_encoder(tokenizer, CLIP_HIDDEN_SIZE)
    with seeded(3):
        text_encoder_2 = tiny_t5_encoder(tokenizer_2, T5_HIDDEN_SIZE)
    return FluxPipeline(
        scheduler=flux_scheduler(),
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2.eval(),
        tokenizer_2=tokenizer_2,
        transformer=transformer.eval(),
    )
