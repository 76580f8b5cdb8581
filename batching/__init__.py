"""stepwise's engine: step-level continuous batching for diffusion models.

Vocabulary (one meaning per word across the package):
- job: one `DiffusionEngine.submit()` call (an API job), with its `job_id`; it may ask
  for several images (`num_images`). `batching.job.Job` tracks it; its Future resolves
  to a `GenerationResult` whose `job_id` is that id.
- sample: one image of a job, `batching.sample.Sample`, made once at submit with its
  step count, cost and key; `sample_id` is the job id for a one-image job and `job_id#i`
  for image i of several. The engine keeps an explicit sample -> job mapping (it never
  parses ids). The scheduler, the plan (`new_samples`, `aborted_sample_ids`) and the
  runner speak only of samples.
- SampleTensors: the runner's tensors of one running sample, beside its `Sample`
  (`batching.sample_tensors`).
- row: one row of a denoiser forward; a sample contributes one or more (two with
  classifier-free guidance), as its family's adapter decides.
- group: the running samples of one compatibility key; one forward per group per step.
- family: a kind of model (sd, sdxl, flux, zimage; `core.families`), served through
  its adapter in `batching.pipelines` behind one contract (`pipelines/contract.py`).

`import batching` does not import torch: the params, the errors and the scheduler are
torch-free (the API process uses them); the engine names load torch on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from core.errors import (
    BatchingError,
    EngineShutdownError,
    InvalidParamsError,
    JobCanceledError,
    JobFailedError,
    ModelLoadError,
)
from core.params import CompatibilityKey, GenerationParams

if TYPE_CHECKING:
    from batching.engine import DiffusionEngine
    from batching.engine_config import EngineConfig
    from batching.job import GenerationResult

_LAZY = {
    "DiffusionEngine": "batching.engine",
    "EngineConfig": "batching.engine_config",
    "GenerationResult": "batching.job",
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
