"""Where a built-in model's folder lives, and how it is made (the names are `core.builtin_models`).

A built-in is built from its builder's configs with seeded weights, saved once under the cache
folder keyed by its version, and from then on loaded like any checkpoint; a trained built-in ships
in the package's assets. Building imports the builder module and the model stack only when a
folder is missing, so locating one stays torch-free.
"""

from __future__ import annotations

import importlib
import os
import shutil
import uuid
from pathlib import Path

from batching.builtin_models.components import ASSETS_DIR
from batching.settings import cache_dir
from core.builtin_models import builtin_model, short_name
from core.errors import ModelLoadError


def builtin_model_path(model: str) -> Path:
    """The folder of a built-in model, building and saving it first if it is missing."""
    entry = builtin_model(model)
    if entry.shipped_folder is not None:
        return ASSETS_DIR / entry.shipped_folder
    folder = cache_dir() / f"builtin-{short_name(model)}-{entry.version}"
    if not (folder / "model_index.json").exists():
        save_builtin_model(model, folder)
    return folder


def save_builtin_model(model: str, folder: Path) -> Path:
    """Build the pipeline and save it to `folder` atomically (safe against concurrent builders)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.{uuid.uuid4().hex}.tmp"
    try:
        shipped = builtin_model(model).shipped_folder
        if shipped is not None:
            shutil.copytree(ASSETS_DIR / shipped, staging)
        else:
            builder = importlib.import_module(_builder(model))
            pipeline = builder.build_pipeline(short_name(model))
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
    return importlib.import_module(_builder(model)).build_pipeline(short_name(model))


def _builder(model: str) -> str:
    builder = builtin_model(model).builder
    if builder is None:
        raise ModelLoadError(f"{model} is a trained model that ships with the package; it is not built from configs")
    return builder
