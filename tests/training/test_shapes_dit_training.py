"""The builtin:shapes-dit training command: it runs, saves a folder the engine serves, and fits the shipped weights."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from batching import DiffusionEngine, EngineConfig, GenerationParams
from batching.builtin_model import builtin_model_path
from batching.pipelines.zimage import shapes_dit
from training.shapes_dit import train


def test_two_training_steps_save_a_folder_the_engine_serves_at_two_sizes_in_one_forward(tmp_path):
    out = tmp_path / "dit"
    train.main(["--out", str(out), "--steps", "2", "--batch", "2", "--sizes", "96", "--box-sizes", "1"])

    record = json.loads((out / "training.json").read_text())
    assert record["transformer_steps"] == 2 and record["sizes"] == [96]
    engine = DiffusionEngine(EngineConfig(model=str(out), device="cpu", max_num_seqs=4))
    try:
        futures = [
            engine.submit(GenerationParams(prompt="a red circle on a blue background", num_inference_steps=2,
                                           height=size, width=size, seed=1, model=str(out)))
            for size in (96, 128)
        ]  # fmt: skip
        assert [future.result(timeout=120).image.size for future in futures] == [(96, 96), (128, 128)]
    finally:
        engine.shutdown(abort=True)


def test_the_shipped_weights_have_the_architecture_the_builder_builds():
    folder = builtin_model_path("builtin:shapes-dit")
    built = shapes_dit.build_pipeline("shapes-dit")
    for name in ("transformer", "text_encoder"):
        shipped_config = json.loads((folder / name / "config.json").read_text())
        built_config = getattr(built, name).config
        built_config = built_config.to_dict() if hasattr(built_config, "to_dict") else dict(built_config)
        for key in ("dim", "n_layers", "n_heads", "in_channels", "cap_feat_dim", "hidden_size", "num_hidden_layers"):
            if key in built_config:
                assert shipped_config[key] == built_config[key], (name, key)
    shipped_vae = json.loads((folder / "vae" / "config.json").read_text())
    assert shipped_vae["shift_factor"] == shapes_dit.VAE_SHIFT_FACTOR
    shipped_weights = load_file(folder / "vae" / "diffusion_pytorch_model.safetensors")
    shapes_weights = load_file(shapes_dit.SHAPES_VAE_DIR / "diffusion_pytorch_model.safetensors")
    assert shipped_weights.keys() == shapes_weights.keys()  # the VAE is builtin:shapes', reused as trained
    assert all(torch.equal(shipped_weights[key], shapes_weights[key]) for key in shapes_weights)
