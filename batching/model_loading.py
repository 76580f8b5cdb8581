"""Loading a model the engine serves: find its files, pick its family's adapter, load its pipeline.

Nothing is downloaded: a built-in model is built and cached on first use, a folder is read as it
is, and a repo id must already be in the Hugging Face cache. Which adapter serves a pipeline class
is the adapters' own declaration (`batching.pipelines`).
"""

from __future__ import annotations

import os

from batching.builtin_models.folders import builtin_model_path
from batching.pipelines import adapter_serving, resolve_device, resolve_dtype
from batching.pipelines.contract import PipelineAdapter
from core.builtin_models import is_builtin
from core.errors import ModelLoadError


def model_source(model: str) -> str:
    """The folder or cached repo id to load `model` from."""
    if is_builtin(model):
        return str(builtin_model_path(model))
    source = os.path.expanduser(model)
    if model.startswith(("/", ".", "~")) and not os.path.isdir(source):  # repo ids are `org/name`
        raise ModelLoadError(f"model folder {model!r} does not exist")
    return source


def load_model(model: str, device: str = "auto", dtype: str = "auto") -> PipelineAdapter:
    """Load `model` (builtin:NAME, a diffusers folder, or a cached repo id) with its family's adapter."""
    torch_device = resolve_device(device)
    source = model_source(model)
    return adapter_serving(model, source).load(model, source, torch_device, resolve_dtype(dtype, torch_device))
