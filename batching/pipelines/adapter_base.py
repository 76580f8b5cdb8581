"""What every family's adapter holds: the loaded pipeline, its VAE and where it runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Self, cast

import torch

from batching.pipelines.image_latents import ImageLatentsMixin
from batching.pipelines.latent_rgb import LatentRgb, latent_rgb_for
from batching.pipelines.loading import load_pipeline
from core.families import FAMILIES
from core.params import GenerationParams

if TYPE_CHECKING:
    from batching.pipelines.contract import PipelineAdapter


class AdapterBase(ImageLatentsMixin):
    family: str  # a key of core.families.FAMILIES, set by each adapter class
    # The diffusers pipeline classes (model_index.json `_class_name`) this adapter serves; it loads with the first.
    pipeline_classes: ClassVar[tuple[str, ...]]
    load_options: ClassVar[dict[str, Any]] = {}  # extra `from_pretrained` arguments of the family's pipeline
    guidance_argument: ClassVar[str] = "guidance_scale"  # the argument of the family's pipeline that a job's
    # guidance_scale is (the static-batching baseline calls the pipeline with it)
    published_latent_rgb: ClassVar[LatentRgb | None] = None  # the family's published latent-to-RGB factors, for
    # `preview_latents`' channels (batching.pipelines.latent_rgb); a model folder's own latent_rgb.json wins

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model  # the name jobs ask for: "builtin:tiny", a folder, or a repo id
        self.device = device
        self.dtype = dtype
        self.spec = FAMILIES[self.family]
        self.pipeline = pipeline
        self.vae = pipeline.vae
        self.vae_scale_factor = pipeline.vae_scale_factor  # the VAE's downsampling, as the pipeline computes it
        self.latent_rgb: LatentRgb | None = self.published_latent_rgb  # `load` finds the model's own

    def texts_to_encode(self, params: GenerationParams) -> list[str]:
        """The prompt, and the negative prompt when the sample runs classifier-free guidance."""
        if self.spec.has_cfg(params.guidance_scale, params.negative_prompt):
            return [params.prompt, params.negative_prompt]
        return [params.prompt]

    @classmethod
    def load_pipeline(cls, model: str, source: str, device: torch.device, dtype: torch.dtype) -> Any:
        """The family's own diffusers pipeline from `source`, as diffusers runs it (the static-batching baseline
        calls it too)."""
        import diffusers

        pipeline_class = getattr(diffusers, cls.pipeline_classes[0])
        return load_pipeline(pipeline_class, model, source, device, dtype, **cls.load_options)

    def preview_latents(self, latents: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        """[c, h, w]: unpacked families' latents are a channel grid already."""
        return latents[0]

    @classmethod
    def load(cls, model: str, source: str, device: torch.device, dtype: torch.dtype) -> Self:
        adapter = cls(model, cls.load_pipeline(model, source, device, dtype), device, dtype)
        adapter.latent_rgb = latent_rgb_for(cast("PipelineAdapter", adapter), source)  # each family completes it
        return adapter


def tokenize(tokenizer: Any, texts: Sequence[str], max_length: int | None = None) -> Any:
    """`texts` padded and truncated to `max_length` (the tokenizer's own maximum unless told), as the diffusers
    pipelines tokenize prompts: a BatchEncoding of [n, max_length] tensors."""
    return tokenizer(
        list(texts),
        padding="max_length",
        max_length=max_length or tokenizer.model_max_length,
        truncation=True,
        return_tensors="pt",
    )
