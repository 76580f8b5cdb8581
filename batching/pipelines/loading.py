"""Reading a model's pipeline class and loading its diffusers pipeline from a local folder or the cache.

Nothing is downloaded (finding the files, building a built-in first: `batching.model_loading`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from core.errors import ModelLoadError


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
