"""The serving suite's real-size models (`benchmarks.gpu.serving_models`) have their checkpoints' sizes.

Built on PyTorch's meta device (shapes without memory), so the configs the GPU run builds at real size
cannot rot unnoticed on a machine without a GPU: each denoiser's parameter count is its checkpoint's,
and each pipeline takes its parts together (an engine adapter reads it)."""

from __future__ import annotations

import pytest
import torch

from batching.pipelines import adapter_class
from benchmarks.gpu.serving import PLANS
from benchmarks.gpu.serving_models import REAL_BUILDERS, _building

# published sizes of the denoisers, in G parameters
CHECKPOINT_SIZES = {"flux": 11.9, "qwenimage": 20.4, "wan": 1.42, "zimage": 6.15, "sd3": 8.06}


@pytest.mark.parametrize("name", sorted(REAL_BUILDERS))
def test_a_real_size_model_has_its_checkpoints_denoiser_and_an_adapter_takes_it(name):
    meta = torch.device("meta")
    pipeline = REAL_BUILDERS[name](lambda: _building(meta, torch.bfloat16))
    plan = next(plan for plan in PLANS if plan.name == name)

    size = sum(parameter.numel() for parameter in pipeline.transformer.parameters()) / 1e9
    adapter = adapter_class(plan.family)(f"suite/{name}", pipeline, meta, torch.bfloat16)

    assert size == pytest.approx(CHECKPOINT_SIZES[name], abs=0.05)
    assert pipeline.transformer.dtype == torch.bfloat16
    assert adapter.max_rows_per_sample in (1, 2)
