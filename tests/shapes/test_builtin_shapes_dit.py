"""builtin:shapes-dit through the engine: a trained Z-Image-family transformer that ships in the repo and draws
what it is asked at two sizes, alone and co-batched with jobs of the other size in the same forwards."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from batching import DiffusionEngine, EngineConfig, GenerationParams
from batching.builtin_model import builtin_family, builtin_model_path
from batching.shapes.accuracy import fixed_cases, run_alone, run_co_batched, score

MODEL = "builtin:shapes-dit"
SIZES = (112, 128)
MAX_FOLDER_BYTES = 16 * 2**20
NUM_CASES = 24  # the fixed set, drawn at 112 and 128 in turn: 12 cases at each size, co-batched
# The shipped weights draw 23/24 (96%) at 112 and at 128 on the whole set, the same alone and co-batched
# (docs/shapes-dit.md). On this test's 12 cases per size they draw 11 at 112 and 12 at 128; each floor leaves a
# margin of one case, so a batching bug that gives rows the wrong prompt, size or guidance (which draws almost
# nothing right) fails here.
MIN_PASSED = {112: 10, 128: 11}


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


def test_co_batched_jobs_of_two_sizes_draw_the_asked_shape_in_the_asked_colours(dit_engine):
    cases = fixed_cases(NUM_CASES, model=MODEL, sizes=SIZES)
    forwards_before = dict(dit_engine.stats()["jobs_per_forward"])
    padded_before = dit_engine.stats()["tokens_padded"]

    images = run_co_batched(dit_engine, cases)

    assert [image.size for image in images] == [(case.size, case.size) for case in cases]
    for size in SIZES:
        at_size = [index for index, case in enumerate(cases) if case.size == size]
        report = score([cases[i] for i in at_size], [images[i] for i in at_size])
        assert report.num_passed >= MIN_PASSED[size], f"{size}x{size}:\n" + "\n".join(report.failures)
    forwards = dit_engine.stats()["jobs_per_forward"]
    assert any(forwards.get(n, 0) > forwards_before.get(n, 0) for n in range(4, 9)), forwards
    assert dit_engine.stats()["tokens_padded"] == padded_before, "two sizes packed into each forward, not padded"
    # sharing forwards with jobs of the other size must not change what is drawn: the first cases alone agree
    num_alone = 6
    alone = score(cases[:num_alone], run_alone(dit_engine, cases[:num_alone]))
    assert alone.failures == score(cases[:num_alone], images[:num_alone]).failures
