"""Which built-in models exist, where their folders live, and how a folder is made.

Torch-free: the family modules that build the pipelines are imported only when a
folder is missing, so `is_builtin`, `builtin_family` and the cache paths cost nothing.
"""

from __future__ import annotations

import importlib
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from batching.errors import ModelLoadError
from batching.settings import cache_dir

BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class BuiltinModel:
    version: str  # bump when the configs or the seeds change: the cache folder is keyed on it
    family: str  # the diffusers pipeline family: a key of batching.families.FAMILIES
    builder: str | None = None  # module with `build_pipeline(name)` (and `save_pipeline(pipeline, folder)` where
    # saving differs from `save_pretrained`), imported only to build; None for a trained model that ships
    shipped_folder: Path | None = None  # a trained model that ships in the package: used as is, never built


BUILTIN_MODELS = {
    "tiny": BuiltinModel(version="v1", family="sd", builder="batching.pipelines.builtins.stable_diffusion"),
    "small": BuiltinModel(version="v1", family="sd", builder="batching.pipelines.builtins.stable_diffusion"),
    "tiny-inpaint": BuiltinModel(version="v1", family="sd", builder="batching.pipelines.builtins.stable_diffusion"),
    "tiny-sdxl": BuiltinModel(version="v2", family="sdxl", builder="batching.pipelines.builtins.sdxl"),
    "tiny-flux": BuiltinModel(version="v1", family="flux", builder="batching.pipelines.builtins.flux"),
    "tiny-zimage": BuiltinModel(version="v1", family="zimage", builder="batching.pipelines.builtins.zimage"),
    "tiny-qwen-image": BuiltinModel(version="v3", family="qwenimage", builder="batching.pipelines.builtins.qwenimage"),
    "tiny-qwen-image-edit": BuiltinModel(
        version="v3", family="qwenimage_edit", builder="batching.pipelines.builtins.qwenimage"
    ),
    "tiny-sd3": BuiltinModel(version="v1", family="sd3", builder="batching.pipelines.builtins.sd3"),
    "tiny-flux2": BuiltinModel(version="v1", family="flux2", builder="batching.pipelines.builtins.flux2"),
    "tiny-flux2-klein": BuiltinModel(version="v1", family="flux2_klein", builder="batching.pipelines.builtins.flux2"),
    "shapes": BuiltinModel(
        version="v1",
        family="sd",
        # trained by training/shapes/train.py (docs/shapes.md), never built here
        shipped_folder=Path(__file__).resolve().parents[1] / "assets" / "builtin-shapes",
    ),
    "shapes-dit": BuiltinModel(
        version="v1",
        family="zimage",
        # the architecture is batching/pipelines/builtins/shapes_dit.py, trained by training/shapes_dit/train.py
        # (docs/shapes-dit.md), never built here
        shipped_folder=Path(__file__).resolve().parents[1] / "assets" / "builtin-shapes-dit",
    ),
}


def is_builtin(model: str) -> bool:
    return model.startswith(BUILTIN_PREFIX)


def builtin_names() -> list[str]:
    return [BUILTIN_PREFIX + name for name in BUILTIN_MODELS]


def builtin_family(model: str) -> str:
    """The family of a built-in model (a key of batching.families.FAMILIES)."""
    return BUILTIN_MODELS[_short_name(model)].family


def builtin_model_path(model: str) -> Path:
    """The folder of a built-in model, building and saving it first if it is missing."""
    name = _short_name(model)
    shipped_folder = BUILTIN_MODELS[name].shipped_folder
    if shipped_folder is not None:
        return shipped_folder
    folder = cache_dir() / f"builtin-{name}-{BUILTIN_MODELS[name].version}"
    if not (folder / "model_index.json").exists():
        save_builtin_model(model, folder)
    return folder


def save_builtin_model(model: str, folder: Path) -> Path:
    """Build the pipeline and save it to `folder` atomically (safe against concurrent builders)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.{uuid.uuid4().hex}.tmp"
    try:
        shipped = BUILTIN_MODELS[_short_name(model)].shipped_folder
        if shipped is not None:
            shutil.copytree(shipped, staging)
        else:
            builder = importlib.import_module(_builder(model))
            pipeline = builder.build_pipeline(_short_name(model))
            save = getattr(builder, "save_pipeline", None)
            save(pipeline, staging) if save else pipeline.save_pretrained(staging)
            save_latent_rgb(model, staging)
        try:
            os.rename(staging, folder)
        except OSError:
            if not (folder / "model_index.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def save_latent_rgb(model: str, folder: Path) -> None:
    """Fit the live previews' latent-to-RGB factors of the built-in saved in `folder` against its own VAE, and
    save them beside it (batching.pipelines.latent_rgb)."""
    import torch

    from batching.pipelines import adapter_serving
    from batching.pipelines.latent_rgb import fit_latent_rgb

    device, dtype = torch.device("cpu"), torch.float32
    adapter_class = adapter_serving(model, str(folder))
    adapter = adapter_class(model, adapter_class.load_pipeline(model, str(folder), device, dtype), device, dtype)
    fit_latent_rgb(adapter).save(folder)


def build_builtin_pipeline(model: str):
    """The diffusers pipeline of a built-in model; its weights are a function of its seeds only."""
    name = _short_name(model)
    return importlib.import_module(_builder(model)).build_pipeline(name)


def _builder(model: str) -> str:
    builder = BUILTIN_MODELS[_short_name(model)].builder
    if builder is None:
        raise ModelLoadError(f"{model} is a trained model that ships with the package; it is not built from configs")
    return builder


def _short_name(model: str) -> str:
    name = model[len(BUILTIN_PREFIX) :] if is_builtin(model) else model
    if name not in BUILTIN_MODELS:
        raise ModelLoadError(f"unknown built-in model {model!r}; known: {', '.join(builtin_names())}")
    return name
