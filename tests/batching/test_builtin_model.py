"""The built-in model: built offline from configs, cached, and loaded like any checkpoint."""

from __future__ import annotations

import shutil

import pytest
import torch

from batching import DiffusionEngine, EngineConfig, ModelLoadError
from batching.builtin_model import build_builtin_pipeline, builtin_model_path
from tests.support.engines import make_params, pixels
from training.tokenizers.make_tokenizer import OUT_DIR, write_tokenizer


def test_the_shipped_tokenizer_is_what_its_script_generates(tmp_path):
    write_tokenizer(tmp_path)

    for shipped in OUT_DIR.iterdir():
        assert (tmp_path / shipped.name).read_bytes() == shipped.read_bytes(), shipped.name


def test_the_builtin_model_is_built_once_then_loaded_from_its_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWISE_CACHE_DIR", str(tmp_path))

    folder = builtin_model_path("builtin:tiny")
    weights = folder / "unet" / "diffusion_pytorch_model.safetensors"
    built_at = weights.stat().st_mtime_ns

    assert folder.parent == tmp_path
    assert {"unet", "vae", "text_encoder", "tokenizer", "scheduler"} <= {p.name for p in folder.iterdir()}
    assert builtin_model_path("builtin:tiny") == folder
    assert weights.stat().st_mtime_ns == built_at


def test_builtin_weights_depend_only_on_the_seed():
    first = build_builtin_pipeline("builtin:tiny")
    torch.manual_seed(12345)
    second = build_builtin_pipeline("builtin:tiny")

    for name in ("unet", "vae", "text_encoder"):
        state_a, state_b = getattr(first, name).state_dict(), getattr(second, name).state_dict()
        assert all(torch.equal(state_a[key], state_b[key]) for key in state_a), name


def test_a_saved_model_folder_loads_through_the_same_path_as_a_checkpoint(solo_engine, tmp_path):
    folder = tmp_path / "my-checkpoint"
    shutil.copytree(builtin_model_path("builtin:tiny"), folder)
    params = make_params()
    expected = solo_engine.submit(params).result(timeout=120).image

    with DiffusionEngine(EngineConfig(model=str(folder), device="cpu", max_num_seqs=1)) as engine:
        image = engine.submit(make_params(model=str(folder))).result(timeout=120).image

    assert (pixels(image) == pixels(expected)).all()


@pytest.mark.parametrize("model", ["builtin:huge", "/no/such/folder", "no-such-org/no-such-model"])
def test_a_model_that_is_not_available_locally_raises_model_load_error(model):
    with pytest.raises(ModelLoadError, match="model"):
        DiffusionEngine(EngineConfig(model=model, device="cpu"))
