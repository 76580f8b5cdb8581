"""Pipeline adapters: one folder per model family, each implementing `contract.PipelineAdapter`.

`<family>/adapter.py` holds what is the family's own (prompt encoding, noise shape, the transformer
call, where its pipeline departs from the shared parts), beside its packed forward (`<family>/packed.py`),
its step cache and its built-in's builder. What families share is here once: `flow_matching` (sampler, initial
latents, packing, token grid, decode), `adapter_base` (a sample's rows and their guidance, padding rows'
zeros, tokenizing, CLIP prompt states), `contract.ForwardBatch` (each row's lengths, predictions in the
batch's form), `vae` (encoding, decoding), `packing` and `packed_attention` (rows of different sizes
packed into one token sequence, attention per row), `packed_video` (a video DiT built like Wan over
packed rows), `encoded_images` (the last reference, edit or first-frame images encoded),
`step_cache_rows`, `image_latents`. docs/families.md, "Adding a family", lists what a new one writes.

A model's family is the family of the adapter that declares its diffusers pipeline class
(`model_index.json`'s `_class_name`), so a checkpoint of a family the engine does not
serve is refused at load, naming it and the pipelines the adapters do serve.
"""

from __future__ import annotations

import torch

from batching.pipelines.contract import PipelineAdapter
from batching.pipelines.flux.adapter import FluxAdapter
from batching.pipelines.flux2.adapter import Flux2Adapter
from batching.pipelines.flux2.klein import Flux2KleinAdapter
from batching.pipelines.loading import pipeline_class_name
from batching.pipelines.qwenimage.adapter import QwenImageAdapter
from batching.pipelines.qwenimage.edit import QwenImageEditAdapter
from batching.pipelines.qwenimage.edit_plus import QwenImageEditPlusAdapter
from batching.pipelines.sd3.adapter import StableDiffusion3Adapter
from batching.pipelines.stable_diffusion.adapter import StableDiffusionAdapter
from batching.pipelines.stable_diffusion.sdxl import StableDiffusionXLAdapter
from batching.pipelines.wan.adapter import WanAdapter
from batching.pipelines.zimage.adapter import ZImageAdapter
from core.errors import ModelLoadError

__all__ = ["PipelineAdapter", "adapter_class", "adapter_serving", "resolve_device", "resolve_dtype"]

AdapterClass = type[
    StableDiffusionAdapter
    | FluxAdapter
    | ZImageAdapter
    | StableDiffusion3Adapter
    | QwenImageAdapter
    | Flux2Adapter
    | WanAdapter
]
ADAPTERS: tuple[AdapterClass, ...] = (
    StableDiffusionAdapter,
    StableDiffusionXLAdapter,
    FluxAdapter,
    ZImageAdapter,
    QwenImageAdapter,
    QwenImageEditAdapter,
    QwenImageEditPlusAdapter,
    StableDiffusion3Adapter,
    Flux2Adapter,
    Flux2KleinAdapter,
    WanAdapter,
)


def adapter_class(family: str) -> AdapterClass:
    """The adapter class of a family in core.families.FAMILIES."""
    return next(adapter for adapter in ADAPTERS if adapter.family == family)


def adapter_serving(model: str, source: str) -> AdapterClass:
    """The adapter class that serves the diffusers pipeline class of the model at `source`."""
    class_name = pipeline_class_name(model, source)
    adapter = next((adapter for adapter in ADAPTERS if class_name in adapter.pipeline_classes), None)
    if adapter is None:
        supported = [name for adapter in ADAPTERS for name in adapter.pipeline_classes]
        raise ModelLoadError(
            f"model {model!r} is a {class_name}, which this engine does not serve; "
            f"supported pipelines: {', '.join(supported)}"
        )
    return adapter


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)
