"""Parts several built-ins share: seeded construction, the tiny VAE, the causal video VAEs' weight spread, the CLIP
tokenizer and text encoders, the tiny Qwen3 text encoder's config, the T5 tokenizer and encoder, SD 1.x's DDIM
schedule.

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


def clip_text_encoder(tokenizer, hidden_size: int, projection_dim: int | None = None):
    """A small CLIP text encoder (`clip_text_config`) for `tokenizer`; with `projection_dim`, one that projects its
    pooled output (SDXL's second encoder, SD3's two)."""
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    if projection_dim is None:
        return CLIPTextModel(clip_text_config(tokenizer, hidden_size))
    return CLIPTextModelWithProjection(clip_text_config(tokenizer, hidden_size, projection_dim=projection_dim))


def tiny_qwen3_config(
    tokenizer,
    hidden_size: int,
    head_dim: int,
    num_hidden_layers: int = 3,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
):
    """A Qwen3 text encoder's config sized for `tokenizer`: small unless told (3 layers, of which Z-Image reads
    the penultimate one's states; 4 query heads sharing 2 key/value heads as in Qwen3), an MLP twice as wide."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        max_position_embeddings=tokenizer.model_max_length,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
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


def spread_conv_weights(vae) -> None:
    """Redraw a causal 3D VAE's convolution weights (Qwen-Image's, Wan's) with std 1/sqrt(fan-in over the one frame
    they see), so the toy's pictures follow its latents: with PyTorch's default init such a small VAE draws nearly
    the same picture for any latents (and encodes any image to nearly the same latents)."""
    import math

    import torch

    with torch.no_grad():
        for weight in (param for name, param in vae.named_parameters() if param.dim() == 5 and "weight" in name):
            weight.normal_(0.0, 1.0 / math.sqrt(weight.shape[1] * weight.shape[3] * weight.shape[4]))


def tiny_causal_vae(vae_class, base_dim: int, z_dim: int, num_res_blocks: int, **layout):
    """A causal 3D VAE of `vae_class` (Qwen-Image's, Wan's) at toy size: four levels of `base_dim` channels, three
    downsamplings, the last two also in time; its weights spread (`spread_conv_weights`)."""
    vae = vae_class(
        base_dim=base_dim,
        z_dim=z_dim,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=num_res_blocks,
        temperal_downsample=[False, True, True],
        **layout,
    )
    spread_conv_weights(vae)
    return vae


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


T5_TOKENIZER_DIR = ASSETS_DIR / "tiny-t5-tokenizer"  # generated by training/tokenizers/make_t5_tokenizer.py
# Qwen3's chat template, thinking on or off (Z-Image, FLUX.2 [klein], builtin:shapes-dit), generated by
# training/tokenizers/make_qwen_tokenizer.py
QWEN_TOKENIZER_DIR = ASSETS_DIR / "tiny-qwen-tokenizer"


def qwen_tokenizer():
    from transformers import Qwen2Tokenizer

    return Qwen2Tokenizer.from_pretrained(QWEN_TOKENIZER_DIR)


def flux_scheduler(**extra):
    """FLUX.1-dev's scheduler config: flow matching whose shift grows with the token count (FLUX.2-dev's adds
    `time_shift_type="exponential"`)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
        **extra,
    )


def t5_tokenizer():
    from transformers import T5TokenizerFast

    return T5TokenizerFast.from_pretrained(T5_TOKENIZER_DIR)


def tiny_t5_encoder(tokenizer, d_model: int):
    """A 2-layer T5 v1.1 encoder (gated GELU, as FLUX's and SD3's T5-XXL) of width `d_model`, for `tokenizer`."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(
        T5Config(  # extra settings (decoder_start_token_id) pass through **kwargs
            vocab_size=len(tokenizer),
            d_model=d_model,
            d_kv=16,
            d_ff=2 * d_model,
            num_layers=2,
            num_heads=4,
            feed_forward_proj="gated-gelu",
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    )
