"""builtin:tiny-sdxl: a StableDiffusionXLPipeline with SDXL's structure at toy size.

Like SDXL, the UNet cross-attends to the two CLIP text encoders' penultimate hidden
states concatenated, and its added conditioning ("text_time") takes the second
encoder's pooled projection plus six size/crop time ids. The two encoders have
different widths on purpose, so code that swaps or mis-concatenates them fails loudly.
Both use the project's tiny CLIP tokenizer.
"""

from __future__ import annotations

from batching.builtin_models.components import clip_text_encoder, clip_tokenizer, seeded, tiny_vae

TEXT_HIDDEN_SIZE = 32  # text_encoder (CLIP ViT-L's role)
TEXT_2_HIDDEN_SIZE = 64  # text_encoder_2 (OpenCLIP bigG's role)
TEXT_2_PROJECTION_DIM = 64  # its pooled output, the UNet's `text_embeds`
ADDITION_TIME_EMBED_DIM = 8
NUM_TIME_IDS = 6  # original size (h, w), crop top-left (y, x), target size (h, w)
VAE_SCALING_FACTOR = 0.13025  # SDXL's VAE


def build_pipeline(name: str):
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    tokenizer = clip_tokenizer()
    with seeded(0):
        unet = UNet2DConditionModel(
            sample_size=16,  # the pipeline's default size: 16 * 8 = 128 pixels
            in_channels=4,
            out_channels=4,
            block_out_channels=(32, 64),
            layers_per_block=2,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            transformer_layers_per_block=(1, 2),
            attention_head_dim=(2, 4),
            use_linear_projection=True,
            cross_attention_dim=TEXT_HIDDEN_SIZE + TEXT_2_HIDDEN_SIZE,
            addition_embed_type="text_time",
            addition_time_embed_dim=ADDITION_TIME_EMBED_DIM,
            projection_class_embeddings_input_dim=NUM_TIME_IDS * ADDITION_TIME_EMBED_DIM + TEXT_2_PROJECTION_DIM,
            norm_num_groups=32,
        )
    with seeded(1):
        vae = tiny_vae(latent_channels=4, scaling_factor=VAE_SCALING_FACTOR)
    with seeded(2):
        text_encoder = clip_text_encoder(tokenizer, TEXT_HIDDEN_SIZE)
    with seeded(3):
        text_encoder_2 = clip_text_encoder(tokenizer, TEXT_2_HIDDEN_SIZE, projection_dim=TEXT_2_PROJECTION_DIM)
    scheduler = EulerDiscreteScheduler(  # SDXL base 1.0's scheduler config
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        prediction_type="epsilon",
        interpolation_type="linear",
        use_karras_sigmas=False,
        timestep_spacing="leading",
        steps_offset=1,
    )
    # SDXL base's scheduler_config.json also carries DDIM's settings, which a job's own sampler built from
    # this config inherits: without clip_sample=False a ddim job clamps its x0 estimate to [-1, 1], which
    # SDXL does not, and on this untrained UNet the clamp turns float noise between batch sizes into
    # whole pixel levels.
    scheduler.register_to_config(clip_sample=False, set_alpha_to_one=False, skip_prk_steps=True, sample_max_value=1.0)
    return StableDiffusionXLPipeline(
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        text_encoder_2=text_encoder_2.eval(),
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        unet=unet.eval(),
        scheduler=scheduler,
        force_zeros_for_empty_prompt=True,
        add_watermarker=False,
    )
