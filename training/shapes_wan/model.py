"""The untrained builtin:shapes-wan pipeline: Wan 2.1's text-to-video layout, sized for two CPU cores.

The classes and config keys of a Wan 2.1 T2V checkpoint (`WanPipeline`: a UMT5 encoder, a
`WanTransformer3DModel` over 1x2x2 patches, a causal 3D `AutoencoderKLWan`, flow-matching UniPC),
so the trained folder loads through `WanPipeline.from_pretrained` and the engine serves it as any
Wan checkpoint. Only the sizes are small, and the VAE downsamples twice (4x4 pixels to a latent
pixel) where Wan's does three times: at 8x8 this VAE had learned far less after the same CPU minutes.
Only its second downsampling is also in time (2 frames to a latent frame after the first, where
Wan's folds 4): folding 4 frames of a shape that moves 2 pixels a frame smeared it (35 of 48
held-out clips pass the checker after encode and decode at 2 frames, 28 at 4; docs/shapes-wan.md).
A 9-frame 64x64 clip is 5 latent frames of 16x16, 320 tokens. (The shipped weights predate this and
fold 4 frames: their folder's config says so.)
The tokenizer is the Wan built-ins' tiny UMT5 one plus the grammar's words it lacks (shapes,
directions, "moving") as whole words.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from core.shapes_vocabulary import COLOURS, DIRECTIONS, SHAPES

GRAMMAR_WORDS = ("a", "an", "moving", "on", "background", *COLOURS, *SHAPES, *DIRECTIONS)
TEXT_DIM = 64  # the UMT5 encoder's width, the transformer's text_dim
TEXT_LAYERS = 2
NUM_HEADS, HEAD_DIM = 4, 32  # rotary axes of the head: frames 12, height 10, width 10
NUM_LAYERS = 4
LATENT_CHANNELS = 8
VAE_BASE_DIM = 8
VAE_DIM_MULT = (1, 2, 2)  # two downsamplings in space: 4x4 pixels to a latent one
VAE_TEMPORAL_DOWNSAMPLE = (False, True)  # the second also in time: 2 frames to a latent one
VAE_FRAMES_PER_LATENT = 2 ** sum(VAE_TEMPORAL_DOWNSAMPLE)
FLOW_SHIFT = 3.0  # Wan 2.1 480p's


def build_tokenizer():
    from transformers import AutoTokenizer

    from training.tokenizers.make_umt5_tokenizer import write_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        return AutoTokenizer.from_pretrained(write_tokenizer(Path(folder), GRAMMAR_WORDS))


def build_text_encoder(tokenizer):
    """A UMT5 encoder (gated GELU, as UMT5-XXL) of width TEXT_DIM."""
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(tokenizer),
            d_model=TEXT_DIM,
            d_kv=16,
            d_ff=2 * TEXT_DIM,
            num_layers=TEXT_LAYERS,
            num_heads=4,
            feed_forward_proj="gated-gelu",
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    )


def build_transformer():
    from diffusers import WanTransformer3DModel

    inner_dim = NUM_HEADS * HEAD_DIM
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=NUM_HEADS,
        attention_head_dim=HEAD_DIM,
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        text_dim=TEXT_DIM,
        freq_dim=64,
        ffn_dim=2 * inner_dim,
        num_layers=NUM_LAYERS,
        cross_attn_norm=True,
    )


def build_vae():
    """Wan's causal 3D VAE at toy size; its latents_mean and latents_std are set after training (the encoded
    training clips' per-channel statistics, as Wan's checkpoints state theirs)."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=VAE_BASE_DIM,
        z_dim=LATENT_CHANNELS,
        dim_mult=list(VAE_DIM_MULT),
        num_res_blocks=1,
        temperal_downsample=list(VAE_TEMPORAL_DOWNSAMPLE),
        scale_factor_spatial=4,  # stated for the pipeline, which reads both from the config (not from the layout):
        scale_factor_temporal=VAE_FRAMES_PER_LATENT,  # left at 4, a 9-frame job would get 3 latent frames, not 5
        latents_mean=[0.0] * LATENT_CHANNELS,
        latents_std=[1.0] * LATENT_CHANNELS,
    )


def build_scheduler():
    """Wan's scheduler config: flow-matching UniPC shifted by FLOW_SHIFT (`batching.pipelines.wan.builtin`)."""
    from batching.pipelines.wan.builtin import _scheduler

    return _scheduler(FLOW_SHIFT)


def assemble(vae, text_encoder, tokenizer, transformer, scheduler=None):
    from diffusers import WanPipeline

    return WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder.eval(),
        vae=vae.eval(),
        transformer=transformer.eval(),
        scheduler=scheduler or build_scheduler(),
    )


def build_pipeline():
    """The architecture with seeded random weights (what training starts from)."""
    from batching.builtin_models.components import seeded, spread_conv_weights

    tokenizer = build_tokenizer()
    with seeded(20):
        vae = build_vae()
        spread_conv_weights(vae)  # PyTorch's default init: its output hardly followed its input, and learned slowly
    with seeded(21):
        transformer = build_transformer()
    with seeded(22):
        text_encoder = build_text_encoder(tokenizer)
    return assemble(vae, text_encoder, tokenizer, transformer)
