"""FLUX.2 [klein] (`Flux2KleinPipeline`) behind the pipeline contract: FLUX.2 with true CFG.

Klein shares FLUX.2-dev's transformer class, VAE, latents, positions, shift and reference
images (`Flux2Adapter` does all of that); what differs is what its pipeline does around
the transformer: the prompt is Qwen3's chat template (thinking off) through a Qwen3 text
encoder whose states after layers 9, 18 and 27 are stacked (the pipeline's own
`encode_prompt`), and its transformer has no guidance embedder, so guidance is true
classifier-free guidance above 1: a conditional and an unconditional row, combined as
`uncond + scale * (cond - uncond)`. The pipeline's unconditional prompt is always empty;
a job may name its own negative prompt (what the pipeline's `negative_prompt_embeds`
takes). A step-distilled checkpoint (`is_distilled` in its `model_index.json`) runs no
CFG at any scale, as its pipeline does.
"""

from __future__ import annotations

from typing import Any

import torch

from batching.pipelines.flux2.adapter import Flux2Adapter
from core.params import GenerationParams


class Flux2KleinAdapter(Flux2Adapter):
    family = "flux2_klein"
    pipeline_classes = ("Flux2KleinPipeline",)

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        self.is_distilled = bool(pipeline.config.get("is_distilled", False))

    def has_cfg(self, params: GenerationParams) -> bool:
        return not self.is_distilled and super().has_cfg(params)
