"""The untrained builtin:shapes-dit pipeline: a ZImagePipeline sized for two CPU cores.

Z-Image's layout (a single-stream transformer over 2x2 latent patches and caption tokens,
the caption being the penultimate hidden states of a Qwen3 text encoder over the prompt in
Qwen3's chat template, flow-matching Euler with a fixed shift), with builtin:shapes' trained
VAE: 4 latent channels instead of FLUX's 16, downsampling by 8, so a 128x128 image is 8x8
patches. The VAE is reused as trained (it reconstructs every prompt at 96-128 px); only the
transformer and the text encoder are trained (`training/shapes_dit/`, docs/shapes-dit.md).
The trained folder ships in `batching/assets/builtin-shapes-dit/`.
"""

from __future__ import annotations

from batching.builtin_models.components import ASSETS_DIR, qwen_tokenizer, seeded, tiny_qwen3_config
from batching.pipelines.zimage.builtin import FLOW_SHIFT, zimage_scheduler, zimage_transformer  # noqa: F401 (training reads FLOW_SHIFT here)

SHAPES_VAE_DIR = ASSETS_DIR / "builtin-shapes" / "vae"
TEXT_HIDDEN_SIZE = 64  # the caption features' width (Z-Image: 2560)
TRANSFORMER_DIM = 128
NUM_LAYERS = 6  # main blocks: the ones a step cache skips after the first
NUM_HEADS = 4
# builtin:shapes' latents (raw, over the training set): mean 0.100, std 2.29. The shift is stated so
# that ZImagePipeline (which always adds the VAE's shift_factor) decodes the folder too.
VAE_SHIFT_FACTOR = 0.1
VAE_SCALING_FACTOR = 0.4366


def build_tokenizer():
    return qwen_tokenizer()


def build_text_encoder(tokenizer):
    from transformers import Qwen3Model

    return Qwen3Model(tiny_qwen3_config(tokenizer, TEXT_HIDDEN_SIZE, head_dim=16))


def build_transformer(latent_channels: int):
    return zimage_transformer(latent_channels, TRANSFORMER_DIM, NUM_LAYERS, NUM_HEADS, TEXT_HIDDEN_SIZE)


def build_vae():
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(SHAPES_VAE_DIR, local_files_only=True)
    vae.register_to_config(shift_factor=VAE_SHIFT_FACTOR, scaling_factor=VAE_SCALING_FACTOR)
    return vae.eval()


def build_scheduler():
    return zimage_scheduler()


def assemble(vae, text_encoder, tokenizer, transformer, scheduler):
    from diffusers import ZImagePipeline

    return ZImagePipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        transformer=transformer.eval(),
    )


def caption_token_ids(tokenizer, texts):
    """Each prompt in Qwen3's chat template, as token ids without padding (as ZImagePipeline templates it)."""
    from batching.pipelines.zimage.adapter import chat_prompts

    return [tokenizer(text, return_tensors="pt").input_ids[0] for text in chat_prompts(tokenizer, texts)]


def caption_features(text_encoder, token_ids):
    """The penultimate hidden states of each prompt's real tokens (padded on the right, masked, as the
    pipeline pads to its maximum length): per prompt [tokens_i, TEXT_HIDDEN_SIZE]. Differentiable."""
    import torch

    lengths = [len(ids) for ids in token_ids]
    padded = torch.zeros(len(token_ids), max(lengths), dtype=torch.long)  # [n, max_tokens]
    mask = torch.zeros_like(padded, dtype=torch.bool)
    for row, ids in enumerate(token_ids):
        padded[row, : len(ids)], mask[row, : len(ids)] = ids, True
    hidden = text_encoder(input_ids=padded, attention_mask=mask, output_hidden_states=True).hidden_states[-2]
    return [row[:length] for row, length in zip(hidden, lengths)]


def build_pipeline(name: str):
    """The architecture with seeded random transformer and text encoder weights (what training starts from)."""
    tokenizer = build_tokenizer()
    vae = build_vae()
    with seeded(10):
        transformer = build_transformer(vae.config.latent_channels)
    with seeded(11):
        text_encoder = build_text_encoder(tokenizer)
    return assemble(vae, text_encoder, tokenizer, transformer, build_scheduler())
