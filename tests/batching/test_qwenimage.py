"""The Qwen-Image family: what its tensor contract adds to every family's guarantees (tests/batching/test_families.py).

Rows of different image shapes and prompt lengths, with and without true-CFG rows, share
one forward; each job still equals itself alone.
"""

from __future__ import annotations

import pytest

from batching import DiffusionEngine, EngineConfig, GenerationParams
from tests.support.engines import max_pixel_diff, run_alone

MODEL = "builtin:tiny-qwen-image"


@pytest.fixture(scope="module")
def engines():
    built = {
        "solo": DiffusionEngine(EngineConfig(model=MODEL, device="cpu", max_num_seqs=1)),
        "batched": DiffusionEngine(EngineConfig(model=MODEL, device="cpu", max_num_seqs=4, max_num_groups=1)),
    }
    yield built
    for engine in built.values():
        engine.shutdown(abort=True)


def qwen_params(**overrides) -> GenerationParams:
    values = dict(prompt="a red fox", model=MODEL, seed=7, num_inference_steps=3, height=64, width=64)
    values.update(overrides)
    return GenerationParams(**values)


def test_jobs_of_different_sizes_prompt_lengths_and_guidance_share_each_forward_each_equal_to_itself_alone(engines):
    params_list = [
        qwen_params(seed=1, prompt="snow"),  # guidance 4 without a negative prompt: one row
        qwen_params(seed=2, height=96, width=96, prompt="a blue bird over the sea at night", negative_prompt="blurry"),
        qwen_params(seed=3, height=64, width=128, guidance_scale=1.0, negative_prompt="dark"),  # scale 1: one row
        qwen_params(seed=4, height=128, width=64, prompt="an old castle", guidance_scale=6.0, negative_prompt="dark"),
    ]
    alone = run_alone(engines["solo"], params_list)
    batched = engines["batched"]
    batched.pause()
    futures = [batched.submit(params) for params in params_list]
    batched.resume()
    images = [future.result(timeout=120).image for future in futures]

    assert [image.size for image in images] == [(p.width, p.height) for p in params_list]
    for image_alone, image in zip(alone, images):
        assert max_pixel_diff(image_alone, image) <= 1
    stats = batched.stats()
    assert stats["sizes_per_forward"] == {4: 3}, "all four sizes in every forward"
    assert stats["rows_per_forward"] == {6: 3}, "two CFG jobs of two rows, two jobs of one"


def test_a_negative_prompt_below_scale_one_changes_nothing_and_above_it_guides(engines):
    plain = engines["solo"].submit(qwen_params(guidance_scale=6.0)).result(timeout=120).image
    unguided = engines["solo"].submit(qwen_params(guidance_scale=1.0, negative_prompt="blurry")).result(timeout=120)
    guided = engines["solo"].submit(qwen_params(guidance_scale=6.0, negative_prompt="blurry")).result(timeout=120)

    assert max_pixel_diff(plain, unguided.image) == 0, "without CFG the scale is unused, as in QwenImagePipeline"
    assert max_pixel_diff(plain, guided.image) > 8
