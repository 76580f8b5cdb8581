"""Small random-weight LoRA files for the built-in models, so tests and the bench need no download.

    python -m benchmarks.random_loras OUT_DIR [--model builtin:tiny] [--names a,b] [--text-encoder]

Each file is `<name>.safetensors` in the diffusers/PEFT format that `load_lora_weights` reads
(`unet.*.lora_A.weight` / `lora_B.weight`, and `text_encoder.*` with `--text-encoder`). Both
LoRA matrices are random (PEFT's `init_lora_weights=False`), seeded by the name, so the adapter
visibly changes the image and the same name always gives the same file.
"""

from __future__ import annotations

import argparse
import zlib
from pathlib import Path

DENOISER_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]  # attention projections: in every family's denoiser
TEXT_ENCODER_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]  # CLIP's attention


def make_lora(
    model: str,
    path: Path,
    *,
    rank: int = 4,
    seed: int = 0,
    with_text_encoder: bool = False,
    text_encoder_name: str = "text_encoder",
    strength: float = 0.3,
) -> Path:
    """Write one random LoRA for `model` to `path` (a .safetensors file) and return the path; with
    `with_text_encoder`, it also adapts the pipeline's `text_encoder_name` (`text_encoder_2`: SDXL's, SD3's second).
    `strength` scales its B matrices (random B is large): 0.3 changes a tiny built-in's image by a few levels,
    about 3 by tens (what tests that must see an adapter's rows apart use)."""
    import torch
    from peft import LoraConfig, inject_adapter_in_model
    from peft.utils import get_peft_model_state_dict

    from batching.model_loading import load_model

    pipeline = load_model(model, "cpu", "float32").pipeline
    denoiser_name = "unet" if hasattr(pipeline, "unet") else "transformer"
    torch.manual_seed(seed)
    layers: dict[str, dict] = {}
    denoiser = getattr(pipeline, denoiser_name)
    denoiser.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=DENOISER_TARGETS, init_lora_weights=False))
    layers[f"{denoiser_name}_lora_layers"] = _scaled(get_peft_model_state_dict(denoiser), strength)
    if with_text_encoder:  # PEFT directly: transformers 5's add_adapter asks for peft>=0.22
        text_encoder = inject_adapter_in_model(
            LoraConfig(r=rank, lora_alpha=rank, target_modules=TEXT_ENCODER_TARGETS, init_lora_weights=False),
            getattr(pipeline, text_encoder_name),
        )
        layers[f"{text_encoder_name}_lora_layers"] = _scaled(get_peft_model_state_dict(text_encoder), strength)
    path.parent.mkdir(parents=True, exist_ok=True)
    type(pipeline).save_lora_weights(str(path.parent), weight_name=path.name, **layers)
    return path


def _scaled(state_dict: dict, strength: float) -> dict:
    """Scale B so the adapter changes the image as much as asked (random B is large)."""
    return {name: tensor * strength if "lora_B" in name else tensor for name, tensor in state_dict.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write small random-weight LoRA files for a built-in model")
    parser.add_argument("out", type=Path, help="folder to write <name>.safetensors into (a file:// LoRA store)")
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--names", default="style-a,style-b,style-c,style-d", help="comma-separated adapter names")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--text-encoder", action="store_true", help="also adapt the text encoder")
    args = parser.parse_args(argv)
    for name in args.names.split(","):
        path = make_lora(
            args.model,
            args.out / f"{name}.safetensors",
            rank=args.rank,
            seed=zlib.crc32(name.encode()),
            with_text_encoder=args.text_encoder,
        )
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
