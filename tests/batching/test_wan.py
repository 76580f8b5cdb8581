"""The Wan video family on its three built-ins: every guarantee the image families have, for every frame.

builtin:tiny-wan (Wan 2.1 text-to-video), builtin:tiny-wan-i2v (image-to-video: init_image is the first
frame) and builtin:tiny-wan22 (Wan 2.2 A14B's two experts). Videos of a few frames at 64-96 pixels, a
few steps: each job co-batched equals itself alone (within 1/255 on every pixel of every frame; bit
for bit in deterministic mode) and equals diffusers' own pipeline for the same seed (within 2/255).
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass

import pytest
import torch
from PIL import Image

from batching import DiffusionEngine, EngineConfig, GenerationParams, InvalidParamsError
from batching.sample import make_samples
from batching.scheduler import Scheduler, SchedulerConfig
from core.families import FAMILIES
from tests.support.engines import (
    engines_by_model,
    max_pixel_diff,
    num_shared_forwards,
    own_pipeline,
    pixels,
    staggered_results,
)
from tests.support.pictures import data_uri, image_bytes


@dataclass(frozen=True)
class Model:
    name: str
    pipeline_class: str
    is_image_to_video: bool = False
    has_two_experts: bool = False


MODELS = [
    Model("builtin:tiny-wan", "WanPipeline"),
    Model("builtin:tiny-wan-i2v", "WanImageToVideoPipeline", is_image_to_video=True),
    Model("builtin:tiny-wan22", "WanPipeline", has_two_experts=True),
]
# (height, width, num_frames): videos of three sizes and frame counts, and a one-frame image
SHAPES = [(64, 64, 9), (64, 96, 5), (96, 64, 13), (80, 80, 1)]


def first_frame(height: int, width: int, seed: int) -> str:
    return data_uri(image_bytes(width, height, seed=seed))


def wan_params(model: Model, **overrides) -> GenerationParams:
    values = dict(
        prompt="a red fox", model=model.name, seed=7, num_inference_steps=5, height=64, width=64, num_frames=9
    )
    values.update(overrides)
    if model.is_image_to_video and "init_image" not in values:
        values["init_image"] = first_frame(values["height"], values["width"], seed=values["seed"])
    return GenerationParams(**values)


def staggered_params(model: Model, *, mixed_shapes: bool = True) -> list[GenerationParams]:
    """Four jobs that differ in prompt, seed, steps, guidance (none included), negative prompt, sampler and (with
    `mixed_shapes`) size and frame count; the two-expert model's also in their low-noise expert's guidance."""
    prompts = ("a red fox", "a blue bird over the sea", "snow", "an old castle at night")
    steps, guidances, samplers = (8, 4, 6, 5), (5.0, 1.0, 3.0, 6.0), ("unipc", "euler", "unipc", "unipc")
    return [
        wan_params(
            model,
            prompt=prompt,
            seed=10 + index,
            num_inference_steps=num_steps,
            guidance_scale=guidance,
            negative_prompt="blurry" if index == 2 else "",
            sampler=sampler,
            height=shape[0],
            width=shape[1],
            num_frames=shape[2],
            guidance_scale_2=2.0 if model.has_two_experts and index in (0, 3) else None,
        )
        for index, (prompt, num_steps, guidance, sampler, shape) in enumerate(
            zip(prompts, steps, guidances, samplers, SHAPES if mixed_shapes else [(64, 64, 5)] * 4)
        )
    ]


def max_frame_diff(result_a, result_b) -> int:
    assert len(result_a.frames) == len(result_b.frames)
    diffs = []
    for frames_a, frames_b in zip(result_a.frames, result_b.frames):
        assert len(frames_a) == len(frames_b)
        diffs += [max_pixel_diff(a, b) for a, b in zip(frames_a, frames_b)]
    return max(diffs)


def run_alone(engine: DiffusionEngine, params_list: list[GenerationParams]) -> list:
    return [engine.submit(params).result(timeout=120) for params in params_list]


@pytest.fixture(scope="module", params=MODELS, ids=lambda model: model.name.removeprefix("builtin:"))
def model(request):
    return request.param


@pytest.fixture(scope="module")
def engines(model):
    """A solo, a batched (one group: every shape in it) and a deterministic engine of the model."""
    built = {
        "solo": DiffusionEngine(EngineConfig(model=model.name, device="cpu", max_num_seqs=1)),
        "batched": DiffusionEngine(EngineConfig(model=model.name, device="cpu", max_num_seqs=4, max_num_groups=1)),
        "deterministic": DiffusionEngine(
            EngineConfig(model=model.name, device="cpu", max_num_seqs=4, deterministic=True)
        ),
    }
    yield built
    for engine in built.values():
        engine.shutdown(abort=True)


def test_staggered_jobs_of_mixed_sizes_frames_steps_and_guidance_each_equal_themselves_alone_on_every_frame(
    model, engines
):
    params_list = staggered_params(model)
    computed_before = engines["solo"].stats()["tokens_computed"]
    alone = run_alone(engines["solo"], params_list)
    computed_alone = engines["solo"].stats()["tokens_computed"] - computed_before
    assert len({pixels(result.image).tobytes() for result in alone}) == len(params_list)
    before = engines["batched"].stats()

    together = staggered_results(engines["batched"], params_list)

    for params, result_alone, result in zip(params_list, alone, together):
        assert len(result.frames) == 1 and len(result.frames[0]) == params.num_frames
        assert {frame.size for frame in result.frames[0]} == {(params.width, params.height)}
        assert result.image is result.frames[0][0]
        assert max_frame_diff(result_alone, result) <= 1, f"{params.width}x{params.height}x{params.num_frames}"
    stats = engines["batched"].stats()
    assert stats["family"] == "wan"
    assert max(stats["jobs_per_forward"]) >= 3, stats["jobs_per_forward"]
    assert max(stats["sizes_per_forward"]) >= 3, "videos of different sizes and frame counts shared forwards"
    assert stats["tokens_padded"] == before["tokens_padded"], "packed: no position is padding"
    assert stats["tokens_computed"] - before["tokens_computed"] == computed_alone, "what the jobs compute alone"
    if not model.is_image_to_video:  # a row: its latent frames' 2x2 patches of 8x8 pixels, and 512 text tokens
        spec = params_list[0].family_spec
        assert computed_alone == sum(
            p.num_inference_steps
            * spec.num_rows(p.guidance_scale, p.negative_prompt)
            * (((p.num_frames - 1) // 4 + 1) * (p.height // 16) * (p.width // 16) + 512)
            for p in params_list
        )


def test_deterministic_mode_is_bit_identical_alone_and_co_batched(model, engines):
    params_list = staggered_params(model, mixed_shapes=False)
    engine = engines["deterministic"]
    alone = run_alone(engine, params_list)
    shared_before = num_shared_forwards(engine)

    together = staggered_results(engine, params_list)

    assert num_shared_forwards(engine) > shared_before, "the jobs shared forwards"
    for result_alone, result in zip(alone, together):
        assert max_frame_diff(result_alone, result) == 0


@pytest.mark.parametrize("sampler", ["unipc", "euler"])
def test_a_video_matches_diffusers_own_pipeline_for_the_same_seed_on_every_frame(model, engines, sampler):
    import diffusers

    params = wan_params(
        model,
        negative_prompt="blurry",
        guidance_scale=4.0,
        sampler=sampler,
        guidance_scale_2=2.0 if model.has_two_experts else None,
    )
    pipeline = own_pipeline(model.name, model.pipeline_class)
    if sampler == "euler":  # the same shift, as a user hands the pipeline an Euler scheduler
        config = pipeline.scheduler.config
        pipeline.scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(config, shift=config.flow_shift)
    inputs = {"guidance_scale_2": params.guidance_scale_2} if model.has_two_experts else {}
    if model.is_image_to_video:
        inputs["image"] = Image.open(io.BytesIO(image_bytes(64, 64, seed=params.seed))).convert("RGB")
    expected = pipeline(
        prompt=params.prompt,
        negative_prompt=params.negative_prompt,
        height=params.height,
        width=params.width,
        num_frames=params.num_frames,
        num_inference_steps=params.num_inference_steps,
        guidance_scale=params.guidance_scale,
        generator=torch.Generator("cpu").manual_seed(params.seed),
        output_type="pil",
        **inputs,
    ).frames[0]

    result = engines["batched"].submit(params).result(timeout=120)

    assert len(result.frames[0]) == len(expected) == params.num_frames
    assert max(max_pixel_diff(frame, own) for frame, own in zip(result.frames[0], expected)) <= 2


def test_a_two_expert_forward_runs_each_expert_over_its_own_rows_in_the_same_iteration():
    """Wan 2.2's experts are chosen per step: a job in its low-noise steps and one in its high-noise steps share
    an iteration, in which each expert runs once, over the rows that need it."""
    model = MODELS[2]
    # 8 steps at flow_shift 12 on UniPC: steps 6 and 7 are below the boundary (t 800, 633 < 875)
    late = wan_params(model, seed=1, num_inference_steps=8, guidance_scale=5.0, guidance_scale_2=3.0)
    early = wan_params(model, seed=2, num_inference_steps=4, guidance_scale=1.0, prompt="snow")
    solo = DiffusionEngine(EngineConfig(model=model.name, device="cpu", max_num_seqs=1))
    engine = DiffusionEngine(EngineConfig(model=model.name, device="cpu", max_num_seqs=2))
    try:
        alone = run_alone(solo, [late, early])
        adapter = engine.model_runner.model
        calls: list[list[tuple[int, int]]] = []  # per group forward: (expert, rows) of each expert call

        def record(expert: int):
            return lambda module, args: calls[-1].append((expert, args[0].shape[0]))

        hooks = [expert.proj_out.register_forward_pre_hook(record(i)) for i, expert in enumerate(adapter.experts)]
        own_forward = adapter.forward

        def forward(batch):
            calls.append([])
            return own_forward(batch)

        adapter.forward = forward
        try:
            together = staggered_results(engine, [late, early], steps_between_joins=6)
        finally:
            adapter.forward = own_forward
            for hook in hooks:
                hook.remove()

        assert [(0, 2), (1, 1)] not in calls  # the late job (2 CFG rows) is in its low-noise steps when early joins
        assert [(0, 1), (1, 2)] in calls, calls  # early's 1 row through the high-noise expert, late's 2 through the low
        assert all(len(call) == len({expert for expert, _ in call}) for call in calls), "each expert once a forward"
        for result_alone, result in zip(alone, together):
            assert max_frame_diff(result_alone, result) <= 1
    finally:
        solo.shutdown(abort=True)
        engine.shutdown(abort=True)


def test_an_interactive_image_pauses_a_low_priority_video_at_a_step_boundary_and_both_equal_themselves_alone():
    model = MODELS[0]
    video = wan_params(model, seed=3, num_inference_steps=10, num_frames=13)
    picture = wan_params(model, seed=4, num_inference_steps=4, num_frames=1, prompt="a blue bird")
    with DiffusionEngine(EngineConfig(model=model.name, device="cpu", max_num_seqs=1)) as engine:
        alone = run_alone(engine, [video, picture])
        seen: dict[str, object] = {}
        futures: dict[str, object] = {}

        def on_picture_progress(done: int, total: int) -> None:
            seen[f"video steps at picture step {done}"] = seen["video steps now"]
            if done == 2:  # the flag as of the end of the picture's first iteration
                seen["video paused"] = futures["video"].is_paused

        def on_video_progress(done: int, total: int) -> None:
            seen["video steps now"] = done
            if done == 3:
                futures["picture"] = engine.submit(picture, priority="high", on_progress=on_picture_progress)

        futures["video"] = engine.submit(video, priority="low", on_progress=on_video_progress)
        results = {name: futures[name].result(timeout=120) for name in ("video", "picture")}

        assert seen["video paused"] is True, seen
        assert seen["video steps at picture step 1"] == seen["video steps at picture step 4"] == 3, seen
        assert engine.stats()["num_preemptions"] >= 1
        assert len(results["picture"].frames[0]) == 1 and len(results["video"].frames[0]) == 13
        assert max_frame_diff(alone[0], results["video"]) <= 1
        assert max_frame_diff(alone[1], results["picture"]) <= 1


def test_a_video_costs_its_latent_frames_in_the_token_budget_so_an_image_fits_beside_it_and_a_second_video_waits():
    spec = FAMILIES["wan"]
    video = GenerationParams(prompt="a fox", model="builtin:tiny-wan", num_frames=33, height=128, width=128, seed=1)
    picture = GenerationParams(prompt="a fox", model="builtin:tiny-wan", num_frames=1, height=128, width=128, seed=2)
    [video_sample] = make_samples("video", video, spec)
    [picture_sample] = make_samples("picture", picture, spec)
    assert video_sample.cost == 9 * picture_sample.cost == 9 * 2 * (128 // 16) ** 2, "9 latent frames, 2 CFG rows"

    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_tokens=video_sample.cost + picture_sample.cost))
    [second_video] = make_samples("second video", video, spec)
    for sample in (video_sample, second_video, picture_sample):
        scheduler.add(sample)
    plan = scheduler.schedule()

    assert [new.sample_id for new in plan.new_samples] == ["video", "picture"]


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"num_frames": 8}, "num_frames"),  # not 4k+1
        ({"num_frames": 0}, "num_frames"),
        ({"num_frames": FAMILIES["wan"].max_num_frames + 4}, "num_frames"),
        ({"num_frames": 9.0}, "num_frames"),
        ({"num_frames": 161, "height": 1280, "width": 1280}, "num_frames"),  # frames x pixels over the video limit
        ({"fps": 0}, "fps"),
        ({"fps": 121}, "fps"),
        ({"fps": "16"}, "fps"),
        ({"sampler": "dpmpp_2m"}, "sampler"),
        ({"height": 72}, "height"),
        ({"guidance_scale_2": 60.0}, "guidance_scale_2"),
        ({"init_image": first_frame(64, 64, 0), "strength": 0.5}, "strength"),
        ({"model": "builtin:tiny", "num_frames": 9}, "num_frames"),  # an image family: one frame
        ({"model": "builtin:tiny", "fps": 16}, "fps"),
        ({"model": "builtin:tiny-flux", "guidance_scale_2": 3.0}, "guidance_scale_2"),
    ],
)
def test_invalid_video_fields_are_refused_naming_the_field(overrides, field):
    values = {"prompt": "a fox", "model": "builtin:tiny-wan", "height": 64, "width": 64, **overrides}
    with pytest.raises(InvalidParamsError) as error:
        GenerationParams(**values)

    assert error.value.field == field


def test_a_video_job_gets_the_family_defaults_and_an_image_job_none():
    video = GenerationParams(prompt="a fox", model="builtin:tiny-wan")
    image = GenerationParams(prompt="a fox", model="builtin:tiny")

    assert (video.num_frames, video.fps, video.sampler, video.guidance_scale) == (33, 16, "unipc", 5.0)
    assert (image.num_frames, image.fps) == (1, None)


@pytest.mark.parametrize(
    "model, overrides, field",
    [
        ("builtin:tiny-wan", {"init_image": first_frame(64, 64, 0)}, "init_image"),  # text-to-video
        ("builtin:tiny-wan-i2v", {}, "init_image"),  # image-to-video needs its first frame
        ("builtin:tiny-wan", {"guidance_scale_2": 3.0}, "guidance_scale_2"),  # one expert
    ],
)
def test_a_model_refuses_at_submit_what_only_its_checkpoint_cannot_do(engines_by_name, model, overrides, field):
    params = GenerationParams(prompt="a fox", model=model, height=64, width=64, num_frames=5, **overrides)
    with pytest.raises(InvalidParamsError) as error:
        engines_by_name(model).submit(params)

    assert error.value.field == field


@pytest.mark.parametrize(
    "model, unusable",
    [
        ("builtin:tiny-wan", {"init_image", "guidance_scale_2"}),  # text-to-video, one expert
        ("builtin:tiny-wan-i2v", {"guidance_scale_2"}),  # image-to-video, one expert
        ("builtin:tiny-wan22", {"init_image"}),  # text-to-video, two experts
    ],
)
def test_each_model_names_the_family_fields_it_cannot_use_for_its_workers_to_report(engines_by_name, model, unusable):
    """What the API refuses at submit by the same rule (api.fleet): the family's model_fields a model lacks."""
    engine = engines_by_name(model)

    assert engine.unusable_fields == unusable
    assert unusable <= set(FAMILIES["wan"].model_fields)


@pytest.fixture(scope="module")
def engines_by_name():
    with engines_by_model(max_num_seqs=1) as engine_for:
        yield engine_for


def test_a_wan_22_ti2v_folder_with_its_own_vae_and_per_token_timesteps_loads_and_matches_its_pipeline(tmp_path):
    """Wan 2.2 TI2V-5B's layout (a 48-channel VAE that downsamples by 16, `expand_timesteps`) saved to a folder:
    its family is read from model_index.json, sizes follow its VAE's 32-pixel unit, a job equals the
    pipeline's video, and videos of two shapes share forwards, each equal to itself alone."""
    import diffusers

    from batching.pipelines.wan.builtin import build_ti2v_pipeline

    build_ti2v_pipeline().save_pretrained(tmp_path)
    folder = str(tmp_path)
    params = GenerationParams(
        prompt="a red fox",
        model=folder,
        sampler="unipc",
        seed=5,
        num_inference_steps=4,
        height=64,
        width=96,
        num_frames=9,
        guidance_scale=4.0,
    )
    pipeline = diffusers.WanPipeline.from_pretrained(folder, local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    expected = pipeline(
        prompt=params.prompt,
        height=64,
        width=96,
        num_frames=9,
        num_inference_steps=4,
        guidance_scale=4.0,
        generator=torch.Generator("cpu").manual_seed(5),
        output_type="pil",
    ).frames[0]
    with DiffusionEngine(EngineConfig(model=folder, device="cpu", max_num_seqs=2)) as engine:
        assert engine.family == "wan"
        with pytest.raises(InvalidParamsError) as error:
            engine.submit(GenerationParams(prompt="a fox", model=folder, height=80, width=64, num_frames=5))
        assert error.value.field == "height"

        result = engine.submit(params).result(timeout=120)
        other = dataclasses.replace(params, seed=6, height=128, width=64, num_frames=5, prompt="snow")
        other_alone = engine.submit(other).result(timeout=120)
        engine.pause()
        together = [engine.submit(params), engine.submit(other)]  # two shapes, per-token timesteps, one forward
        engine.resume()
        together = [future.result(timeout=120) for future in together]
        assert engine.stats()["sizes_per_forward"].get(2, 0) >= 4

    assert max(max_pixel_diff(frame, own) for frame, own in zip(result.frames[0], expected)) <= 2
    assert max_frame_diff(result, together[0]) <= 1 and max_frame_diff(other_alone, together[1]) <= 1


def test_a_job_of_two_videos_gives_each_its_frames_and_the_second_equals_a_job_of_the_next_seed(engines_by_name):
    model = MODELS[1]  # image-to-video: both samples animate the job's one first frame
    engine = engines_by_name(model.name)
    params = wan_params(model, seed=21, num_frames=5, num_images=2, init_image=first_frame(64, 64, 3))

    result = engine.submit(params).result(timeout=120)
    second = engine.submit(dataclasses.replace(params, seed=22, num_images=1)).result(timeout=120)

    assert result.seeds == [21, 22] and [len(frames) for frames in result.frames] == [5, 5]
    assert [frames[0] for frames in result.frames] == result.images
    assert max(max_pixel_diff(a, b) for a, b in zip(result.frames[1], second.frames[0])) <= 1
    assert max_pixel_diff(result.frames[0][1], result.frames[1][1]) > 0, "two seeds, two videos"


def test_a_video_job_previews_its_first_frame_every_n_steps_at_the_video_s_aspect(engines_by_name):
    engine = engines_by_name(MODELS[0].name)
    previews: list = []

    engine.submit(
        wan_params(MODELS[0], num_inference_steps=5, height=64, width=96), preview_every=2, on_preview=previews.append
    ).result(timeout=120)

    assert [preview.step for preview in previews] == [2, 4]  # not after the last: the video itself is next
    assert previews[0].image().size == (96, 64)
