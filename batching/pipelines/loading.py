"""Finding a model's files, reading its pipeline class, and loading its diffusers pipeline.

Nothing is downloaded: a built-in model is built and cached on first use, a folder is
read as it is, and a repo id must already be in the Hugging Face cache. Which adapter
serves a pipeline class is the adapters' own declaration (`batching.pipelines`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from batching.builtin_model import builtin_model_path, is_builtin
from batching.errors import ModelLoadError


def model_source(model: str) -> str:
    """The folder or cached repo id to load `model` from."""
    if is_builtin(model):
        return str(builtin_model_path(model))
    source = os.path.expanduser(model)
    if model.startswith(("/", ".", "~")) and not os.path.isdir(source):  # repo ids are `org/name`
        raise ModelLoadError(f"model folder {model!r} does not exist")
    return source


def pipeline_class_name(model: str, source: str) -> str:
    """The diffusers pipeline class of the model at `source`: its model_index.json `_class_name`."""
    from diffusers import DiffusionPipeline

    try:
        config = DiffusionPipeline.load_config(source, local_files_only=True)
    except Exception as e:
        raise ModelLoadError(
            f"could not read model_index.json of model {model!r} from a local folder or the Hugging Face cache "
            f"(nothing is downloaded at run time): {type(e).__name__}: {e}"
        ) from e
    return config.get("_class_name", "<none>")


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


def quiet_model_libraries() -> None:
    """Keep transformers' and diffusers' loading notices (e.g. that an image processor would like
    torchvision, which this engine never uses) and their progress bars out of a server's log or a CLI's output."""
    import diffusers
    import transformers

    for library in (diffusers, transformers):
        library.utils.logging.set_verbosity_error()
        library.utils.logging.disable_progress_bar()
