"""builtin:shapes-wan through the engine: a trained Wan text-to-video model that ships in the repo and draws the
shape, colours and direction it is asked, on prompts it never saw in training, co-batched."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from batching import DiffusionEngine, EngineConfig, GenerationParams
from batching.builtin_model import builtin_family, builtin_model_path
from batching.shapes.clip_accuracy import fixed_clip_cases, score_clips

MODEL = "builtin:shapes-wan"
MAX_FOLDER_BYTES = 8 * 2**20
# The shipped weights draw MEASURED/24 of the held-out set right at 10 steps (docs/shapes-wan.md); the floor is the
# issue's 80%, so a batching bug that gives rows the wrong prompt, frames or guidance (which draws almost nothing
# right) fails here.
MIN_PASSED = 20


def test_the_shipped_folder_is_a_wan_pipeline_of_safetensors_under_8_mb():
    folder = builtin_model_path(MODEL)
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline" and builtin_family(MODEL) == "wan"
    weights = sorted(folder.rglob("*.safetensors"))
    assert {path.parent.name for path in weights} == {"transformer", "vae", "text_encoder"}
    assert not list(folder.rglob("*.bin")) and not list(folder.rglob("*.pt"))
    assert sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) <= MAX_FOLDER_BYTES


@pytest.fixture(scope="module")
def wan_engine():
    engine = DiffusionEngine(EngineConfig(model=MODEL, device="cpu", max_num_seqs=8))
    yield engine
    engine.shutdown(abort=True)


def test_a_job_without_size_or_frames_gets_the_trained_64x64_nine_frame_clip(wan_engine):
    params = GenerationParams(prompt="a red circle moving right on a blue background", seed=1,
                              num_inference_steps=2, model=MODEL)  # fmt: skip
    frames = wan_engine.submit(params).result(timeout=120).frames[0]
    assert len(frames) == 9 and {frame.size for frame in frames} == {(64, 64)}


def test_held_out_co_batched_clips_show_the_asked_colours_shape_and_direction(wan_engine):
    cases = fixed_clip_cases()
    forwards_before = dict(wan_engine.stats()["jobs_per_forward"])

    futures = [wan_engine.submit(case.params()) for case in cases]
    clips = [future.result(timeout=300).frames[0] for future in futures]

    report = score_clips(cases, clips)
    assert report.num_passed >= MIN_PASSED, f"{report.num_passed}/{report.num_cases}:\n" + "\n".join(report.failures)
    forwards = wan_engine.stats()["jobs_per_forward"]
    assert any(forwards.get(n, 0) > forwards_before.get(n, 0) for n in range(4, 9)), forwards
    # sharing forwards must not change what is drawn: the first cases alone get the same verdicts
    num_alone = 4
    alone = [wan_engine.submit(case.params()).result(timeout=120).frames[0] for case in cases[:num_alone]]
    assert score_clips(cases[:num_alone], alone).failures == score_clips(cases[:num_alone], clips[:num_alone]).failures


def test_a_job_matches_what_diffusers_own_pipeline_draws_from_the_folder(wan_engine):
    from diffusers import WanPipeline

    params = GenerationParams(prompt="a green square moving up on a purple background", seed=3,
                              num_inference_steps=6, model=MODEL)  # fmt: skip
    pipeline = WanPipeline.from_pretrained(builtin_model_path(MODEL), local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    expected = pipeline(
        prompt=params.prompt, height=64, width=64, num_frames=9, num_inference_steps=params.num_inference_steps,
        guidance_scale=params.guidance_scale, generator=torch.Generator("cpu").manual_seed(params.seed),
        output_type="np",
    ).frames[0]  # fmt: skip  # [9, 64, 64, 3] in [0, 1]

    frames = wan_engine.submit(params).result(timeout=120).frames[0]

    drawn = np.stack([np.asarray(frame, dtype=np.int16) for frame in frames])
    assert np.abs(drawn - np.round(expected * 255).astype(np.int16)).max() <= 2
