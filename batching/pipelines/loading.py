"""Finding a model's files, telling its family, and loading its diffusers pipeline.

Nothing is downloaded: a built-in model is built and cached on first use, a folder is
read as it is, and a repo id must already be in the Hugging Face cache. The family comes
from `model_index.json`'s `_class_name`, so a checkpoint of a family the engine does not
serve is refused at load, naming it and the families it does serve.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from batching.builtin_model import builtin_model_path, is_builtin
from batching.errors import ModelLoadError
from batching.families import family_of_pipeline_class, supported_pipeline_classes


def model_source(model: str) -> str:
    """The folder or cached repo id to load `model` from."""
    if is_builtin(model):
        return str(builtin_model_path(model))
    source = os.path.expanduser(model)
    if model.startswith(("/", ".", "~")) and not os.path.isdir(source):  # repo ids are `org/name`
        raise ModelLoadError(f"model folder {model!r} does not exist")
    return source


def detect_family(model: str, source: str) -> str:
    """The family of the pipeline at `source`, from its model_index.json `_class_name`."""
    from diffusers import DiffusionPipeline

    try:
        config = DiffusionPipeline.load_config(source, local_files_only=True)
    except Exception as e:
        raise ModelLoadError(
            f"could not read model_index.json of model {model!r} from a local folder or the Hugging Face cache "
            f"(nothing is downloaded at run time): {type(e).__name__}: {e}"
        ) from e
    class_name = config.get("_class_name", "<none>")
    family = family_of_pipeline_class(class_name)
    if family is None:
        raise ModelLoadError(
            f"model {model!r} is a {class_name}, which this engine does not serve; "
            f"supported pipelines: {', '.join(supported_pipeline_classes())}"
        )
    return family


def load_pipeline(
    pipeline_class: Any, model: str, source: str, device: torch.device, dtype: torch.dtype, **components: Any
) -> Any:
    """`pipeline_class.from_pretrained(source)` on `device`, every module in eval mode without grads."""
    try:
        with warnings.catch_warnings():  # newer diffusers renames torch_dtype; older ones know only it
            warnings.simplefilter("ignore", FutureWarning)
            pipeline = pipeline_class.from_pretrained(source, torch_dtype=dtype, local_files_only=True, **components)
    except Exception as e:
        raise ModelLoadError(
            f"could not load model {model!r} from a local folder or the Hugging Face cache "
            f"(nothing is downloaded at run time): {type(e).__name__}: {e}"
        ) from e
    pipeline.to(device)
    for module in pipeline.components.values():
        if isinstance(module, torch.nn.Module):
            module.eval().requires_grad_(False)
    return pipeline
