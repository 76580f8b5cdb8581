"""The built-in models: real Stable-Diffusion-style pipelines with seeded random weights.

`builtin:tiny` is small enough that a 20-step 128x128 job takes well under a second on
two CPU cores; `builtin:small` has a denoiser large enough to dominate the step time,
for benchmarks. Each is built from configs (no download), saved once with
`save_pretrained` under the cache folder, and from then on loaded with
`from_pretrained(local_files_only=True)`, exactly like a real checkpoint.

    python -m batching.builtin_model builtin:tiny      # build if missing, print the folder
"""

from __future__ import annotations

import argparse
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from batching.errors import ModelLoadError

BUILTIN_PREFIX = "builtin:"
TOKENIZER_DIR = Path(__file__).resolve().parent / "assets" / "tiny-clip-tokenizer"
SEED = 0


@dataclass(frozen=True)
class BuiltinSpec:
    version: str  # bump when the configs or the seed change: the cache folder is keyed on it
    unet_channels: tuple[int, ...]
    text_hidden_size: int  # also the UNet's cross-attention dim
    vae_channels: tuple[int, ...]  # 4 levels: the VAE downsamples by 8 like SD's


BUILTIN_SPECS = {
    "tiny": BuiltinSpec(version="v1", unet_channels=(32, 64), text_hidden_size=32, vae_channels=(16, 32, 64, 64)),
    "small": BuiltinSpec(version="v1", unet_channels=(64, 128, 256), text_hidden_size=64, vae_channels=(16, 32, 64, 64)),
}


def is_builtin(model: str) -> bool:
    return model.startswith(BUILTIN_PREFIX)


def cache_dir() -> Path:
    configured = os.environ.get("STEPWISE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "stepwise"


def builtin_model_path(model: str) -> Path:
    """The folder of a built-in model, building and saving it first if it is missing."""
    spec_name = _spec_name(model)
    spec = BUILTIN_SPECS[spec_name]
    folder = cache_dir() / f"builtin-{spec_name}-{spec.version}"
    if not (folder / "model_index.json").exists():
        save_builtin_model(model, folder)
    return folder


def save_builtin_model(model: str, folder: Path) -> Path:
    """Build the pipeline and save it to `folder` atomically (safe against concurrent builders)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.{uuid.uuid4().hex}.tmp"
    try:
        build_builtin_pipeline(model).save_pretrained(staging)
        try:
            os.rename(staging, folder)
        except OSError:
            if not (folder / "model_index.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def build_builtin_pipeline(model: str):
    """A StableDiffusionPipeline built from configs; weights are a function of SEED only."""
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    spec = BUILTIN_SPECS[_spec_name(model)]
    tokenizer = CLIPTokenizer.from_pretrained(TOKENIZER_DIR)
    num_unet_levels = len(spec.unet_channels)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        unet = UNet2DConditionModel(
            sample_size=16,
            in_channels=4,
            out_channels=4,
            block_out_channels=spec.unet_channels,
            layers_per_block=2,
            down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (num_unet_levels - 1),
            up_block_types=("CrossAttnUpBlock2D",) * (num_unet_levels - 1) + ("UpBlock2D",),
            cross_attention_dim=spec.text_hidden_size,
            attention_head_dim=8,
            norm_num_groups=32,
        )
        torch.manual_seed(SEED + 1)
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            block_out_channels=spec.vae_channels,
            down_block_types=("DownEncoderBlock2D",) * len(spec.vae_channels),
            up_block_types=("UpDecoderBlock2D",) * len(spec.vae_channels),
            latent_channels=4,
            layers_per_block=1,
            norm_num_groups=16,
            sample_size=128,
        )
        torch.manual_seed(SEED + 2)
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=len(tokenizer),
                hidden_size=spec.text_hidden_size,
                intermediate_size=2 * spec.text_hidden_size,
                num_hidden_layers=5,
                num_attention_heads=4,
                max_position_embeddings=tokenizer.model_max_length,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        )
    scheduler = DDIMScheduler(  # Stable Diffusion 1.x's training schedule
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        prediction_type="epsilon",
    )
    return StableDiffusionPipeline(
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        unet=unet.eval(),
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def _spec_name(model: str) -> str:
    name = model[len(BUILTIN_PREFIX):] if is_builtin(model) else model
    if name not in BUILTIN_SPECS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_SPECS)
        raise ModelLoadError(f"unknown built-in model {model!r}; known: {known}")
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="build a built-in model and print its folder")
    parser.add_argument("model", nargs="?", default="builtin:tiny", help="builtin:tiny or builtin:small")
    parser.add_argument("--out", type=Path, help="save here instead of the cache folder")
    args = parser.parse_args(argv)
    folder = save_builtin_model(args.model, args.out) if args.out else builtin_model_path(args.model)
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
