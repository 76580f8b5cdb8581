"""The untrained builtin:shapes pipeline: a Stable Diffusion 1.x layout, sized for two CPU cores.

The same classes and config keys as any SD 1.x checkpoint (UNet2DConditionModel,
AutoencoderKL downsampling by 8, CLIPTextModel with the project's tiny tokenizer,
SD's DDIM training schedule), so the trained folder loads through
`StableDiffusionPipeline.from_pretrained` and runs under every sampler the engine
offers. Only the sizes are small: 128x128 images become 16x16 latents.
"""

from __future__ import annotations

from batching.builtin_models.components import CLIP_TOKENIZER_DIR

TOKENIZER_DIR = CLIP_TOKENIZER_DIR
TEXT_HIDDEN_SIZE = 64  # also the UNet's cross-attention dim
UNET_CHANNELS = (32, 64, 64)
UNET_LAYERS_PER_BLOCK = 2
MAX_PROMPT_TOKENS = 32  # the grammar's longest prompt is 24 tokens with its start and end tokens
VAE_CHANNELS = (16, 32, 32, 32)  # 4 levels: downsample by 8 like SD's


def build_tokenizer():
    from transformers import CLIPTokenizer

    return CLIPTokenizer.from_pretrained(TOKENIZER_DIR, model_max_length=MAX_PROMPT_TOKENS)


def build_text_encoder(tokenizer):
    from transformers import CLIPTextModel

    from batching.builtin_models.components import clip_text_config

    return CLIPTextModel(clip_text_config(tokenizer, TEXT_HIDDEN_SIZE, num_hidden_layers=2))


def build_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=VAE_CHANNELS,
        down_block_types=("DownEncoderBlock2D",) * len(VAE_CHANNELS),
        up_block_types=("UpDecoderBlock2D",) * len(VAE_CHANNELS),
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=4,  # 16 groups of 16 channels would be instance norm, which erases a flat colour
        sample_size=128,
        mid_block_add_attention=False,  # fully convolutional: trained on crops, exact at any size
    )


def build_unet():
    from diffusers import UNet2DConditionModel

    num_levels = len(UNET_CHANNELS)
    return UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        block_out_channels=UNET_CHANNELS,
        layers_per_block=UNET_LAYERS_PER_BLOCK,
        down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (num_levels - 1),
        up_block_types=("CrossAttnUpBlock2D",) * (num_levels - 1) + ("UpBlock2D",),
        cross_attention_dim=TEXT_HIDDEN_SIZE,
        attention_head_dim=8,
        norm_num_groups=16,
    )


def build_scheduler():
    from batching.builtin_models.components import sd_ddim_scheduler

    # SD 1.x's betas, rescaled to zero terminal SNR, with v-prediction and trailing timesteps (Lin et al. 2023,
    # "Common Diffusion Noise Schedules and Sample Steps are Flawed"). With SD's own schedule the last training
    # step still holds 7% of the image: on 16x16 latents of flat colours the mean colour survives that noise, so
    # the model learns to copy colours from its input instead of reading the prompt, and at sampling time copies
    # them from the random starting noise (an epsilon run of 750 steps drew the right shapes in random colours).
    return sd_ddim_scheduler(prediction_type="v_prediction", rescale_betas_zero_snr=True, timestep_spacing="trailing")
