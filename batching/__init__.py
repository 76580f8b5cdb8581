"""stepwise's engine: step-level continuous batching for diffusion models.

`import batching` does not import torch: the params, the errors and the scheduler are
torch-free (the API process uses them); the engine names load torch on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from batching.errors import (
    BatchingError,
    EngineShutdownError,
    InvalidParamsError,
    JobCanceledError,
    JobFailedError,
    ModelLoadError,
)
from batching.params import CompatibilityKey, GenerationParams

if TYPE_CHECKING:
    from batching.engine import DiffusionEngine, EngineConfig
    from batching.request import GenerationResult

_LAZY = {
    "DiffusionEngine": "batching.engine",
    "EngineConfig": "batching.engine",
    "GenerationResult": "batching.request",
}

__all__ = [
    "BatchingError",
    "CompatibilityKey",
    "DiffusionEngine",
    "EngineConfig",
    "EngineShutdownError",
    "GenerationParams",
    "GenerationResult",
    "InvalidParamsError",
    "JobCanceledError",
    "JobFailedError",
    "ModelLoadError",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'batching' has no attribute {name!r}")
