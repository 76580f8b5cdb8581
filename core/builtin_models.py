"""The built-in models: their names, families and versions. Torch-free.

A built-in is a real diffusers pipeline of its family with seeded random weights, built from
configs by its builder (a module of the engine, named here as a string and imported only to
build), or a trained model whose folder ships in the engine's assets. Building, caching and
loading them is the engine's (`batching.builtin_models`); this table is what the API, the
worker and the family rules read.
"""

from __future__ import annotations

from dataclasses import dataclass

from core import shapes_vocabulary
from core.errors import ModelLoadError

BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class BuiltinModel:
    version: str  # bump when the configs or the seeds change: the cache folder is keyed on it
    family: str  # the diffusers pipeline family: a key of core.families.FAMILIES
    builder: str | None = None  # module with `build_pipeline(name)` (and `save_pipeline(pipeline, folder)` where
    # saving differs from `save_pretrained`), imported only to build; None for a trained model that ships
    shipped_folder: str | None = None  # a trained model's folder in the engine's assets (batching/assets): used as
    # is, never built
    sizes: tuple[int, ...] = ()  # a trained model's sizes (pixels a side) it was trained at, its best first; ()
    # for random weights, which draw any size alike
    vocabulary: str | None = None  # "shapes": it knows only core.shapes_vocabulary's prompts; None: any prompt


BUILTIN_MODELS = {
    "tiny": BuiltinModel(version="v1", family="sd", builder="batching.pipelines.stable_diffusion.builtin"),
    "small": BuiltinModel(version="v1", family="sd", builder="batching.pipelines.stable_diffusion.builtin"),
    "tiny-inpaint": BuiltinModel(version="v1", family="sd", builder="batching.pipelines.stable_diffusion.builtin"),
    "tiny-sdxl": BuiltinModel(version="v2", family="sdxl", builder="batching.pipelines.stable_diffusion.builtin_sdxl"),
    "tiny-flux": BuiltinModel(version="v1", family="flux", builder="batching.pipelines.flux.builtin"),
    "tiny-zimage": BuiltinModel(version="v1", family="zimage", builder="batching.pipelines.zimage.builtin"),
    "tiny-qwen-image": BuiltinModel(version="v3", family="qwenimage", builder="batching.pipelines.qwenimage.builtin"),
    "tiny-qwen-image-edit": BuiltinModel(
        version="v3", family="qwenimage_edit", builder="batching.pipelines.qwenimage.builtin"
    ),
    "tiny-qwen-image-edit-plus": BuiltinModel(  # the Qwen-Image-Edit-2509 layout
        version="v1", family="qwenimage_edit_plus", builder="batching.pipelines.qwenimage.builtin"
    ),
    "tiny-sd3": BuiltinModel(version="v1", family="sd3", builder="batching.pipelines.sd3.builtin"),
    "tiny-flux2": BuiltinModel(version="v1", family="flux2", builder="batching.pipelines.flux2.builtin"),
    "tiny-flux2-klein": BuiltinModel(version="v1", family="flux2_klein", builder="batching.pipelines.flux2.builtin"),
    "tiny-wan": BuiltinModel(version="v1", family="wan", builder="batching.pipelines.wan.builtin"),
    "tiny-wan-i2v": BuiltinModel(version="v1", family="wan", builder="batching.pipelines.wan.builtin"),
    "tiny-wan22": BuiltinModel(version="v1", family="wan", builder="batching.pipelines.wan.builtin"),
    # trained by training/shapes/train.py (docs/shapes.md), never built here
    "shapes": BuiltinModel(
        version="v1", family="sd", shipped_folder="builtin-shapes", sizes=(128,), vocabulary="shapes"
    ),
    # the architecture is batching/pipelines/zimage/shapes_dit.py, trained by training/shapes_dit/train.py
    # (docs/shapes-dit.md), never built here
    "shapes-dit": BuiltinModel(  # trained at 96, 112 and 128 (best at 112 and 128, docs/shapes-dit.md)
        version="v1", family="zimage", shipped_folder="builtin-shapes-dit", sizes=(128, 112, 96), vocabulary="shapes"
    ),
}


def is_builtin(model: str) -> bool:
    return model.startswith(BUILTIN_PREFIX)


def builtin_names() -> list[str]:
    return [BUILTIN_PREFIX + name for name in BUILTIN_MODELS]


def builtin_model(model: str) -> BuiltinModel:
    """The table's entry of `builtin:NAME`; ModelLoadError naming the known ones for any other name."""
    name = short_name(model)
    if name not in BUILTIN_MODELS:
        raise ModelLoadError(f"unknown built-in model {model!r}; known: {', '.join(builtin_names())}")
    return BUILTIN_MODELS[name]


def builtin_family(model: str) -> str:
    """The family of a built-in model (a key of core.families.FAMILIES)."""
    return builtin_model(model).family


def short_name(model: str) -> str:
    """`tiny` of `builtin:tiny` (a bare name stays as it is)."""
    return model.removeprefix(BUILTIN_PREFIX)


def prompt_warnings(model: str, prompt: str) -> list[str]:
    """Sentences for a person about a prompt the model will draw but does not know (a trained built-in's fixed
    vocabulary); [] for every other model and prompt."""
    entry = BUILTIN_MODELS.get(short_name(model)) if is_builtin(model) else None
    if entry is None or entry.vocabulary != "shapes" or shapes_vocabulary.parse_prompt(prompt) is not None:
        return []
    return [
        f"the prompt is outside what {model} knows, so its picture will not follow it: the model draws only "
        f"{shapes_vocabulary.grammar()} (two different colours)"
    ]
