"""An adapter's text-encoder weights, injected with PEFT directly.

diffusers loads text-encoder LoRA weights through transformers' `load_adapter`, which in
transformers 5 asks for a PEFT release newer than any published (0.22); the layers are
plain PEFT LoRA layers either way, so this injects them with PEFT itself (as diffusers does
for the denoiser). Keys arrive in diffusers' format (`text_encoder.<module>.lora_A.weight`),
after diffusers' own conversion of other trainers' names (`lora_state_dict`).
"""

from __future__ import annotations

from typing import Any

import torch

from core.errors import LoraError, describe

PREFIX = "text_encoder."


def split_text_encoder(state_dict: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(text-encoder weights without the prefix, the rest)."""
    text_encoder = {key.removeprefix(PREFIX): value for key, value in state_dict.items() if key.startswith(PREFIX)}
    rest = {key: value for key, value in state_dict.items() if not key.startswith(PREFIX)}
    return text_encoder, rest


def inject(
    text_encoder: Any, weights: dict[str, torch.Tensor], alphas: dict[str, float] | None, adapter_name: str, name: str
) -> None:
    """Add `weights` to `text_encoder` as PEFT adapter `adapter_name`, disabled (RowLoras activates rows)."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict

    targets = sorted({key.split(".lora_A.")[0] for key in weights if ".lora_A." in key})
    ranks = {target: weights[f"{target}.lora_A.weight"].shape[0] for target in targets}
    if not targets or len(set(ranks.values())) != 1:
        raise LoraError(
            f"LoRA adapter {name!r} has text-encoder weights this engine cannot read "
            "(no lora_A/lora_B pairs, or ranks that differ between layers)"
        )
    rank = next(iter(ranks.values()))
    text_alphas = {value for key, value in (alphas or {}).items() if key.startswith(PREFIX)}
    alpha = text_alphas.pop() if len(text_alphas) == 1 else rank
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets)  # type: ignore[arg-type]  # a float works
    try:
        inject_adapter_in_model(config, text_encoder, adapter_name=adapter_name)
        result = set_peft_model_state_dict(text_encoder, weights, adapter_name=adapter_name)
    except Exception as e:
        raise LoraError(f"LoRA adapter {name!r} does not fit the text encoder: {describe(e)}") from e
    unexpected_keys = getattr(result, "unexpected_keys", None)
    if unexpected_keys:
        raise LoraError(
            f"LoRA adapter {name!r} does not fit the text encoder: unexpected weights {unexpected_keys[:3]}"
        )
