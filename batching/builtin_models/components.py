"""Parts several built-ins share: seeded construction, the tiny VAE, the CLIP tokenizer and text encoder,
SD 1.x's DDIM schedule.

Every module is constructed right after `torch.manual_seed` inside a forked RNG, so a
built-in's weights depend on its seeds only, never on what ran before in the process.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
CLIP_TOKENIZER_DIR = ASSETS_DIR / "tiny-clip-tokenizer"
SEED = 0

# Four levels, like SD's: the VAE downsamples by 8.
TINY_VAE_CHANNELS = (16, 32, 64, 64)
FLUX_LATENT_CHANNELS = 16
FLUX_VAE_SCALING_FACTOR, FLUX_VAE_SHIFT_FACTOR = 0.3611, 0.1159


@contextmanager
def seeded(offset: int):
    """Run the body with the global CPU RNG seeded to SEED + offset, restoring it afterwards."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED + offset)
        yield


def clip_tokenizer():
    from transformers import CLIPTokenizer

    return CLIPTokenizer.from_pretrained(CLIP_TOKENIZER_DIR)


def clip_text_config(
    tokenizer, hidden_size: int, num_hidden_layers: int = 5, num_attention_heads: int = 4, mlp_ratio: int = 2, **extra
):
    """A CLIP text encoder config sized for `tokenizer` (small unless told: 5 layers, 4 heads, an MLP twice as wide)."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=mlp_ratio * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        max_position_embeddings=tokenizer.model_max_length,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def tiny_vae(latent_channels: int, **extra):
    """An AutoencoderKL of about 1 M parameters that downsamples by 8."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=TINY_VAE_CHANNELS,
        down_block_types=("DownEncoderBlock2D",) * len(TINY_VAE_CHANNELS),
        up_block_types=("UpDecoderBlock2D",) * len(TINY_VAE_CHANNELS),
        latent_channels=latent_channels,
        layers_per_block=1,
        norm_num_groups=16,
        sample_size=128,
        **extra,
    )


def tiny_flux_vae():
    """FLUX's VAE layout (16 latent channels, no quant convs, its scaling and shift) at `tiny_vae`'s size; Z-Image
    uses FLUX's VAE too."""
    return tiny_vae(
        latent_channels=FLUX_LATENT_CHANNELS,
        use_quant_conv=False,
        use_post_quant_conv=False,
        scaling_factor=FLUX_VAE_SCALING_FACTOR,
        shift_factor=FLUX_VAE_SHIFT_FACTOR,
    )


def sd_ddim_scheduler(**overrides):
    """A DDIMScheduler with Stable Diffusion 1.x's training schedule (epsilon prediction unless `overrides` say)."""
    from diffusers import DDIMScheduler

    values = dict(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        prediction_type="epsilon",
    )
    values.update(overrides)
    return DDIMScheduler(**values)
