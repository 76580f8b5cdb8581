"""A compiled denoiser (`EngineConfig.denoiser_compile`) draws the images of the eager one, alone and co-batched.

On the CPU with the `aot_eager` backend: TorchDynamo captures the UNet and AOTAutograd traces it as Inductor
would, then it runs eagerly (Inductor's own C++ compile of two buckets takes minutes on this machine:
docs/benchmarks.md). The compiled forwards are padded to their row-count buckets."""

from __future__ import annotations

import torch

from tests.support.engines import make_params, max_pixel_diff


def test_a_compiled_denoiser_draws_the_eager_images_alone_and_co_batched(fresh_engine):
    eager = fresh_engine(max_num_seqs=2, encode_overlap=False)
    compiled = fresh_engine(max_num_seqs=2, encode_overlap=False, denoiser_compile="aot_eager")
    first = make_params(prompt="a lighthouse at dusk", seed=1, num_inference_steps=4)
    second = make_params(prompt="a red fox", seed=2, num_inference_steps=3, guidance_scale=4.0)
    frames_before = sum(torch._dynamo.utils.counters["frames"].values())

    alone_eager = eager.submit(first).result(timeout=300).image
    alone_compiled = compiled.submit(first).result(timeout=300).image  # one job: the 2-row bucket
    futures = [compiled.submit(params) for params in (first, second)]  # together: the 4-row bucket
    together = [future.result(timeout=300).image for future in futures]
    second_eager = eager.submit(second).result(timeout=300).image

    assert compiled.model_runner.compiled == ["unet"] and compiled.model_runner.row_buckets == (2, 4)
    assert sum(torch._dynamo.utils.counters["frames"].values()) > frames_before, "dynamo captured the UNet"
    assert max_pixel_diff(alone_compiled, alone_eager) <= 1
    assert max_pixel_diff(together[0], alone_eager) <= 1
    assert max_pixel_diff(together[1], second_eager) <= 1
    assert compiled.stats()["rows_per_forward"] == {2: 4 + 1, 4: 3}, "padding rows are not counted as rows"
