"""builtin:shapes-dit through the engine: a trained Z-Image-family transformer that ships in the repo and draws
what it is asked at two sizes, alone and co-batched with jobs of the other size in the same forwards."""

from __future__ import annotations

import json

import pytest

from batching import DiffusionEngine, EngineConfig
from batching.builtin_model import builtin_family, builtin_model_path
from batching.shapes.accuracy import fixed_cases, run_alone, run_co_batched, score

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


def test_co_batched_jobs_of_two_sizes_draw_the_asked_shape_in_the_asked_colours(dit_engine):
    cases = fixed_cases(NUM_CASES, model=MODEL, sizes=SIZES)
    forwards_before = dict(dit_engine.stats()["jobs_per_forward"])

    images = run_co_batched(dit_engine, cases)

    assert [image.size for image in images] == [(case.size, case.size) for case in cases]
    for size in SIZES:
        at_size = [index for index, case in enumerate(cases) if case.size == size]
        report = score([cases[i] for i in at_size], [images[i] for i in at_size])
        assert report.accuracy >= MIN_ACCURACY, f"{size}x{size}:\n" + "\n".join(report.failures)
    forwards = dit_engine.stats()["jobs_per_forward"]
    assert any(forwards.get(n, 0) > forwards_before.get(n, 0) for n in range(4, 9)), forwards
    # sharing forwards with jobs of the other size must not change what is drawn: the first cases alone agree
    num_alone = 6
    alone = score(cases[:num_alone], run_alone(dit_engine, cases[:num_alone]))
    assert alone.failures == score(cases[:num_alone], images[:num_alone]).failures
