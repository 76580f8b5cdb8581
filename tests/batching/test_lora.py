"""LoRA adapters in the engine (builtin:tiny): rows with different adapters, scales and none share a forward,
each job equal to itself alone and to diffusers' own pipeline with the adapter set at that scale."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from batching import DiffusionEngine, EngineConfig, JobFailedError
from benchmarks.random_loras import make_lora
from tests.support.engines import make_params, max_pixel_diff, own_pipeline, own_pipeline_image, run_alone

ADAPTERS = ("style-a", "style-b")
# Adapters this strong change a tiny built-in's image by tens of levels, so a row's delta leaking to a batch
# mate (or lost) shows far above the co-batching tolerance of one level.
STRENGTH = 3.0


@pytest.fixture(scope="module")
def lora_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loras")
    for seed, name in enumerate(ADAPTERS):
        make_lora("builtin:tiny", folder / f"{name}.safetensors", seed=seed, strength=STRENGTH)
    (folder / "not-safetensors.safetensors").write_bytes(b"\x80\x04pickle, not safetensors")
    make_lora("builtin:tiny", folder / "with-text.safetensors", seed=5, with_text_encoder=True)
    save_file(
        {
            key: value
            for key, value in load_file(folder / "with-text.safetensors").items()
            if not key.startswith("text_encoder.")
        },
        folder / "without-text.safetensors",
    )
    return folder


@pytest.fixture(scope="module")
def lora_engines(lora_folder):
    """A mixing engine (rows with different adapters share a forward) and one running jobs one by one; the
    mixing one encodes prompts beside its loop (text-encoder adapters on the encoder's thread), the other inline."""
    url = lora_folder.as_uri()
    mixed = DiffusionEngine(
        EngineConfig(device="cpu", max_num_seqs=6, lora_url=url, max_num_groups=1, encode_overlap=True)
    )
    solo = DiffusionEngine(EngineConfig(device="cpu", max_num_seqs=1, lora_url=url, encode_overlap=False))
    yield mixed, solo
    mixed.shutdown(abort=True)
    solo.shutdown(abort=True)


def lora_workload() -> list:
    return [
        make_params(prompt="a red fox", seed=1, lora="with-text", lora_scale=0.8),
        make_params(prompt="a red fox", seed=1, lora="style-a", num_inference_steps=10),
        make_params(prompt="a blue bird", seed=2, lora="style-b", lora_scale=0.5),
        make_params(prompt="a red fox", seed=1, num_inference_steps=10),  # the job above without its adapter
        make_params(prompt="a calm lake", seed=4, lora="style-a", lora_scale=-0.7, guidance_scale=1.0),
        make_params(prompt="snow", seed=5, lora="style-b", lora_scale=1.5, sampler="ddim"),
    ]


def test_jobs_with_different_adapters_share_forwards_and_each_equals_itself_alone(lora_engines):
    mixed, solo = lora_engines
    workload = lora_workload()
    futures = [mixed.submit(params) for params in workload]
    together = [future.result(timeout=120).image for future in futures]
    alone = run_alone(solo, workload)

    for image_together, image_alone in zip(together, alone):
        assert max_pixel_diff(image_together, image_alone) <= 1
    assert max_pixel_diff(together[1], together[3]) > 20, "the adapter changes the image (co-batching: at most 1)"
    assert any(count >= 2 for count in mixed.stats()["loras_per_forward"]), mixed.stats()["loras_per_forward"]
    assert max(mixed.stats()["jobs_per_forward"]) == len(workload)


def test_an_adapter_job_equals_diffusers_pipeline_with_the_adapter_at_that_scale(lora_engines, lora_folder):
    mixed, _ = lora_engines
    params = make_params(prompt="a blue bird", seed=2, lora="style-b", lora_scale=0.5, negative_prompt="blurry")
    others = [make_params(seed=9, lora="style-a"), make_params(seed=10)]
    futures = [mixed.submit(p) for p in [params, *others]]
    image = futures[0].result(timeout=120).image

    pipeline = own_pipeline("builtin:tiny", "StableDiffusionPipeline")
    pipeline.load_lora_weights(str(lora_folder / "style-b.safetensors"), adapter_name="style_b")
    pipeline.set_adapters(["style_b"], adapter_weights=[params.lora_scale])
    expected = own_pipeline_image(pipeline, params)
    for future in futures[1:]:
        future.result(timeout=120)

    assert max_pixel_diff(image, expected) <= 2


def test_a_missing_or_invalid_adapter_fails_only_its_own_job_naming_it(lora_engines):
    mixed, _ = lora_engines
    good = mixed.submit(make_params(lora="style-a", num_inference_steps=4))
    missing = mixed.submit(make_params(lora="no-such-adapter"))
    pickle = mixed.submit(make_params(lora="not-safetensors"))

    with pytest.raises(JobFailedError, match="'no-such-adapter' does not exist"):
        missing.result(timeout=60)
    with pytest.raises(JobFailedError, match="'not-safetensors' is not a safetensors file"):
        pickle.result(timeout=60)
    assert good.result(timeout=120).image.size == (64, 64)


def test_an_adapter_that_does_not_fit_the_model_fails_its_job_naming_it(lora_engines, lora_folder):
    from safetensors.torch import save_file

    save_file(
        {
            "unet.down_blocks.0.attentions.0.proj_in.lora_A.weight": torch.zeros(4, 7),
            "unet.down_blocks.0.attentions.0.proj_in.lora_B.weight": torch.zeros(7, 4),
        },
        str(lora_folder / "wrong-shape.safetensors"),
    )
    mixed, _ = lora_engines
    with pytest.raises(JobFailedError, match="'wrong-shape' does not fit"):
        mixed.submit(make_params(lora="wrong-shape")).result(timeout=60)
    assert mixed.submit(make_params(lora="style-a", num_inference_steps=3)).result(timeout=60).image


def test_the_group_mode_runs_one_adapter_per_forward_with_the_same_images(lora_folder, lora_engines):
    mixed, _ = lora_engines
    workload = lora_workload()[:4]
    expected = [future.result(timeout=120).image for future in [mixed.submit(p) for p in workload]]
    with DiffusionEngine(
        EngineConfig(device="cpu", max_num_seqs=6, lora_url=lora_folder.as_uri(), lora_mode="group", max_num_groups=3)
    ) as grouped:
        images = [future.result(timeout=120).image for future in [grouped.submit(p) for p in workload]]
        stats = grouped.stats()
    assert set(stats["loras_per_forward"]) <= {0, 1}
    for image, image_expected in zip(images, expected):
        assert max_pixel_diff(image, image_expected) <= 1


@pytest.mark.parametrize(
    "model",
    [
        "builtin:tiny-sdxl",
        "builtin:tiny-flux",
        "builtin:tiny-zimage",
        "builtin:tiny-sd3",
        "builtin:tiny-qwen-image",
        "builtin:tiny-flux2",
    ],
)
def test_other_families_mix_adapters_in_one_forward_each_job_equal_to_itself_alone(model, tmp_path):
    for seed, name in enumerate(ADAPTERS):
        make_lora(model, tmp_path / f"{name}.safetensors", seed=seed, strength=STRENGTH)
    workload = [
        make_params(model=model, prompt="a fox", seed=1, num_inference_steps=3, lora="style-a", guidance_scale=None),
        make_params(model=model, prompt="a fox", seed=1, num_inference_steps=3, guidance_scale=None),
        make_params(
            model=model,
            prompt="a bird",
            seed=2,
            num_inference_steps=3,
            lora="style-b",
            lora_scale=0.5,
            guidance_scale=None,
            width=64 if model == "builtin:tiny-sdxl" else 128,  # a DiT packs rows of different sizes
        ),
    ]
    with DiffusionEngine(EngineConfig(model=model, device="cpu", max_num_seqs=4, lora_url=tmp_path.as_uri())) as engine:
        together = [future.result(timeout=120).image for future in [engine.submit(p) for p in workload]]
        alone = run_alone(engine, workload)
        stats = engine.stats()
        assert stats["loras_per_forward"].get(2), stats["loras_per_forward"]
        assert model == "builtin:tiny-sdxl" or max(stats["sizes_per_forward"]) == 2, "adapters of packed rows"

    for image_together, image_alone in zip(together, alone):
        assert max_pixel_diff(image_together, image_alone) <= 1
    assert max_pixel_diff(together[0], together[1]) > 20, "the adapter changes the image (co-batching: at most 1)"


def test_an_adapter_for_another_text_encoder_fails_its_job_and_leaves_later_prompts_alone(tmp_path):
    """SD3 (like SDXL) has more than one text encoder; weights for its second one are refused, naming the adapter.
    Loaded, they would have adapted the encoder for every job's prompts, not only the adapter's own."""
    model = "builtin:tiny-sd3"
    make_lora(
        model, tmp_path / "second-text.safetensors", seed=3, with_text_encoder=True, text_encoder_name="text_encoder_2"
    )
    plain = make_params(model=model, prompt="a fox", seed=1, num_inference_steps=2, guidance_scale=None)
    with DiffusionEngine(EngineConfig(model=model, device="cpu", max_num_seqs=2, lora_url=tmp_path.as_uri())) as engine:
        before = engine.submit(plain).result(timeout=120).image
        with pytest.raises(JobFailedError, match="'second-text' has text-encoder weights"):
            engine.submit(dataclasses.replace(plain, lora="second-text")).result(timeout=120)
        after = engine.submit(plain).result(timeout=120).image

    assert max_pixel_diff(before, after) == 0


def test_the_cache_evicts_least_recently_used_adapters_but_never_one_in_use(lora_folder):
    config = EngineConfig(device="cpu", max_num_seqs=4, lora_url=lora_folder.as_uri(), lora_cache_adapters=1)
    with DiffusionEngine(config) as engine:
        first = engine.submit(make_params(lora="style-a", num_inference_steps=3)).result(timeout=60).image
        engine.submit(make_params(lora="style-b", num_inference_steps=3)).result(timeout=60)
        again = engine.submit(make_params(lora="style-a", num_inference_steps=3)).result(timeout=60).image
        after_one_at_a_time = engine.stats()
        together = [engine.submit(make_params(lora=name, num_inference_steps=3)) for name in ADAPTERS]
        images = [future.result(timeout=60).image for future in together]
        stats = engine.stats()

    assert (after_one_at_a_time["lora_loads"], after_one_at_a_time["lora_evictions"]) == (3, 2)
    assert max_pixel_diff(first, again) == 0  # reloaded after its eviction, the same adapter
    assert stats["loras_loaded"] == 2, "both in use at once: the bound waits until one is free"
    assert max_pixel_diff(images[0], first) <= 1


def test_an_adapter_with_text_encoder_weights_encodes_its_prompts_with_them(lora_engines):
    mixed, _ = lora_engines
    with_text = mixed.submit(make_params(prompt="a red fox", seed=1, lora="with-text", lora_scale=0.8))
    without_text = mixed.submit(make_params(prompt="a red fox", seed=1, lora="without-text", lora_scale=0.8))
    assert max_pixel_diff(with_text.result(timeout=120).image, without_text.result(timeout=120).image) > 3


def write_hostile(folder, name: str) -> None:
    """`<name>.safetensors`: style-a (or with-text) broken in the way `name` says."""
    weights = load_file(folder / "style-a.safetensors")
    first_down = sorted(key for key in weights if ".lora_A." in key)[0]
    if name == "nan-weights":
        weights[first_down] = torch.full_like(weights[first_down], float("nan"))
    elif name == "inf-weights":
        weights[first_down] = weights[first_down].clone().index_fill_(1, torch.tensor([0]), float("inf"))
    elif name == "nan-text-encoder":
        weights = load_file(folder / "with-text.safetensors")
        text_down = sorted(key for key in weights if key.startswith("text_encoder.") and ".lora_A." in key)[0]
        weights[text_down] = torch.full_like(weights[text_down], float("nan"))
    elif name == "nan-alpha":  # kohya's names, with an alpha per module
        kohya = {}
        for key, value in weights.items():
            module, matrix = key.removeprefix("unet.").rsplit(".lora_", 1)
            prefix = "lora_unet_" + module.replace(".", "_")
            kohya[prefix + (".lora_down.weight" if matrix.startswith("A") else ".lora_up.weight")] = value
            kohya[prefix + ".alpha"] = torch.tensor(float("nan") if first_down.startswith(f"unet.{module}.") else 4.0)
        weights = kohya
    elif name == "up-only":
        weights = {key: value for key, value in weights.items() if ".lora_B." in key}
    elif name == "text-encoder-only":
        weights = {key: value for key, value in load_file(folder / "with-text.safetensors").items() if "text_" in key}
    elif name == "wrong-in-dims":
        weights = {
            key: torch.zeros(4, value.shape[1] + 3) if ".lora_A." in key else value for key, value in weights.items()
        }
    elif name == "memory-bomb":  # 16 bytes of data declared as a 100000x100000 float32 tensor (40 GB)
        header = json.dumps({"w": {"dtype": "F32", "shape": [100000, 100000], "data_offsets": [0, 16]}}).encode()
        (folder / f"{name}.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
        return
    save_file(weights, str(folder / f"{name}.safetensors"))


@pytest.mark.parametrize(
    "name, message",
    [
        ("nan-weights", "has weights that are not finite (NaN or infinity) in 'unet."),
        ("inf-weights", "has weights that are not finite (NaN or infinity)"),
        ("nan-text-encoder", "has weights that are not finite (NaN or infinity) in 'text_encoder."),
        ("nan-alpha", "has alpha 'lora_unet_"),
        ("up-only", "without its 'lora_A.weight'"),
        ("memory-bomb", "shape [100000, 100000] of F32 is 40000000000 bytes, its data_offsets span 16"),
        ("text-encoder-only", "has weights only for the text encoder"),
        ("wrong-in-dims", "does not fit the model: RuntimeError: Error(s) in loading state_dict"),
    ],
)
def test_a_broken_adapter_fails_only_its_own_job_naming_it_and_its_batch_mates_draw_their_own_images(
    lora_engines, lora_folder, name, message
):
    """NaN weights or alpha would make every image of the adapter black: refused, like a file whose header lies
    (never allocated) or whose matrices do not pair or fit. The jobs submitted with it, with another adapter and
    with none, are the images they are alone; the broken adapter is not left in the cache."""
    write_hostile(lora_folder, name)
    mixed, solo = lora_engines
    others = [make_params(prompt="a red fox", seed=1, lora="style-a"), make_params(prompt="a blue bird", seed=2)]
    futures = [mixed.submit(params) for params in others[:1]]
    broken = mixed.submit(make_params(prompt="a red fox", seed=3, lora=name))
    futures.append(mixed.submit(others[1]))

    with pytest.raises(JobFailedError) as failure:
        broken.result(timeout=120)
    assert f"LoRA adapter {name!r} " in str(failure.value) and message in str(failure.value)
    assert len(str(failure.value)) < 500, "a readable message, not PEFT's list of every mismatching layer"
    for image, image_alone in zip([future.result(timeout=120).image for future in futures], run_alone(solo, others)):
        assert max_pixel_diff(image, image_alone) <= 1
    assert not mixed.loras.cache.is_loaded(name)


def test_an_adapter_whose_finite_weights_overflow_fails_its_job_naming_it_instead_of_a_black_image(
    lora_engines, lora_folder
):
    """Weights of 1e18 are finite (the file passes) but overflow in the forward: the job fails at decode, naming
    the adapter, and the jobs sharing its forwards are the images they are alone."""
    save_file(
        {key: value * 1e18 for key, value in load_file(lora_folder / "style-a.safetensors").items()},
        str(lora_folder / "overflowing.safetensors"),
    )
    mixed, solo = lora_engines
    others = [make_params(prompt="a red fox", seed=1, lora="style-b"), make_params(prompt="a blue bird", seed=2)]
    futures = [mixed.submit(others[0]), mixed.submit(make_params(seed=3, lora="overflowing")), mixed.submit(others[1])]

    with pytest.raises(JobFailedError, match="not finite .* its LoRA adapter 'overflowing' \\(scale 1.0\\)"):
        futures[1].result(timeout=120)
    for image, image_alone in zip(
        [futures[0].result(timeout=120).image, futures[2].result(timeout=120).image], run_alone(solo, others)
    ):
        assert max_pixel_diff(image, image_alone) <= 1
