"""builtin:shapes through the engine: it ships in the repo, loads like any checkpoint, and draws what it is asked,
also when its jobs share forwards at staggered steps with mixed guidance."""

from __future__ import annotations

import json

import pytest

from batching import DiffusionEngine, EngineConfig
from batching.builtin_model import builtin_model_path
from batching.shapes.accuracy import MODEL, fixed_cases, run_alone, run_co_batched, score

MAX_WEIGHTS_BYTES = 20 * 2**20
# The issue asks for 90%. The shipped weights draw 23 of the 24 cases (96%), alone and co-batched alike
# (docs/shapes.md); the floor leaves a margin of one case, so a batching bug that gives rows the wrong prompt
# or guidance (which drops far lower) fails here.
MIN_CO_BATCHED_ACCURACY = 0.9


def test_the_shipped_folder_is_a_diffusers_pipeline_of_safetensors_under_20_mb():
    folder = builtin_model_path(MODEL)
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionPipeline"
    weights = sorted(folder.rglob("*.safetensors"))
    assert {path.parent.name for path in weights} == {"unet", "vae", "text_encoder"}
    assert not list(folder.rglob("*.bin")) and not list(folder.rglob("*.pt"))
    assert sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) <= MAX_WEIGHTS_BYTES


@pytest.fixture(scope="module")
def shapes_engine():
    engine = DiffusionEngine(EngineConfig(model=MODEL, device="cpu", max_num_seqs=8))
    yield engine
    engine.shutdown(abort=True)


def test_co_batched_jobs_with_mixed_guidance_draw_the_asked_shape_in_the_asked_colours(shapes_engine):
    cases = fixed_cases(24)
    forwards_before = dict(shapes_engine.stats()["jobs_per_forward"])

    co_batched_images = run_co_batched(shapes_engine, cases)
    report = score(cases, co_batched_images)

    assert report.accuracy >= MIN_CO_BATCHED_ACCURACY, "\n".join(report.failures)
    forwards = shapes_engine.stats()["jobs_per_forward"]
    assert any(forwards.get(n, 0) > forwards_before.get(n, 0) for n in range(4, 9)), forwards
    # batching must not change what is drawn: the first cases, run alone, get the same verdicts
    num_alone = 6
    alone = score(cases[:num_alone], run_alone(shapes_engine, cases[:num_alone]))
    assert alone.failures == score(cases[:num_alone], co_batched_images[:num_alone]).failures
