"""The engine's errors, re-exported: they live in `core.errors`, beside the params that raise `InvalidParamsError`
(one hierarchy, torch-free, so the worker and the API catch them without loading the engine)."""

from core.errors import (
    BatchingError,
    EngineShutdownError,
    InvalidParamsError,
    JobCanceledError,
    JobFailedError,
    LoraError,
    ModelLoadError,
)

__all__ = [
    "BatchingError",
    "EngineShutdownError",
    "InvalidParamsError",
    "JobCanceledError",
    "JobFailedError",
    "LoraError",
    "ModelLoadError",
]
