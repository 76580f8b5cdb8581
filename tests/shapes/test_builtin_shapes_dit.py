"""builtin:shapes-dit through the engine: a trained Z-Image-family transformer that ships in the repo and draws
what it is asked at two sizes, alone and co-batched with jobs of the other size in the same forwards."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from batching import DiffusionEngine, EngineConfig, GenerationParams
from batching.builtin_model import builtin_family, builtin_model_path

MODEL = "builtin:shapes-dit"
SIZES = (96, 128)
MAX_FOLDER_BYTES = 16 * 2**20
# The issue asks for 90%; the floor is checked on 12 cases per size (half the fixed set, the shapes and colours
# still cycle), so a batching bug that mixes up rows' prompts, sizes or guidance (which drops far lower) fails.
MIN_ACCURACY = 0.9
NUM_CASES = 24  # co-batched: 12 at each size, alternating


def test_the_shipped_folder_is_a_zimage_pipeline_of_safetensors_under_16_mb():
    folder = builtin_model_path(MODEL)
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "ZImagePipeline" and builtin_family(MODEL) == "zimage"
    weights = sorted(folder.rglob("*.safetensors"))
    assert {path.parent.name for path in weights} == {"transformer", "vae", "text_encoder"}
    assert not list(folder.rglob("*.bin")) and not list(folder.rglob("*.pt"))
    assert sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) <= MAX_FOLDER_BYTES


@pytest.fixture(scope="module")
def dit_engine():
    engine = DiffusionEngine(EngineConfig(model=MODEL, device="cpu", max_num_seqs=8))
    yield engine
    engine.shutdown(abort=True)


def test_a_job_matches_what_diffusers_own_pipeline_draws_from_the_folder(dit_engine):
    from diffusers import ZImagePipeline

    params = GenerationParams(prompt="a green square on a purple background", seed=3, num_inference_steps=6,
                              guidance_scale=5.0, height=96, width=96, model=MODEL)  # fmt: skip
    pipeline = ZImagePipeline.from_pretrained(builtin_model_path(MODEL), local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    expected = pipeline(
        prompt=params.prompt, height=96, width=96, num_inference_steps=params.num_inference_steps,
        guidance_scale=params.guidance_scale, generator=torch.Generator("cpu").manual_seed(params.seed),
    ).images[0]  # fmt: skip

    image = dit_engine.submit(params).result(timeout=120).image

    difference = np.abs(np.asarray(image, dtype=np.int16) - np.asarray(expected, dtype=np.int16))
    assert difference.max() <= 2
