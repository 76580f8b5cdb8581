"""`stepwise generate`: a PNG on disk, or one clear line and exit code 2 for bad arguments."""

from __future__ import annotations

import shutil

import av
import pytest
from PIL import Image

from batching.builtin_model import builtin_model_path
from stepwise_cli.main import main


def generate_96x64(out, model: str, *options: str) -> int:
    """`stepwise generate` of "a red fox" at 96x64 on the CPU into `out`; its exit code."""
    size = ["--height", "64", "--width", "96", "--device", "cpu"]
    return main(["generate", "--model", model, "--prompt", "a red fox", *size, *options, "--out", str(out)])


def test_generate_writes_a_png_of_the_requested_size_with_no_progress_bar_off_a_terminal(tmp_path, capsys):
    out = tmp_path / "fox.png"

    code = generate_96x64(out, "builtin:tiny", "--seed", "7", "--steps", "4")

    assert code == 0
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (96, 64)
    captured = capsys.readouterr()
    assert "seed 7" in captured.out
    assert "denoising" not in captured.err  # captured output is not a terminal: no bar in logs


def test_generate_with_preview_writes_the_jobs_live_preview_beside_its_image(tmp_path):
    out, preview = tmp_path / "fox.png", tmp_path / "preview.jpg"

    code = generate_96x64(out, "builtin:tiny", "--steps", "8", "--preview", str(preview), "--preview-every", "2")

    assert code == 0 and out.exists()
    with Image.open(preview) as shown:
        assert shown.format == "JPEG" and shown.size == (96, 64)  # the image's aspect, at most 256 px


def test_generate_with_bad_steps_exits_2_with_one_line_naming_the_field(tmp_path, capsys):
    code = main(["generate", "--prompt", "a red fox", "--steps", "0", "--out", str(tmp_path / "x.png")])

    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "--steps" in err and "num_inference_steps" in err
    assert not (tmp_path / "x.png").exists()


def test_generate_loads_a_model_folder_given_with_model(tmp_path):
    folder = tmp_path / "checkpoint"
    shutil.copytree(builtin_model_path("builtin:tiny"), folder)
    out = tmp_path / "out.png"

    code = main(
        [
            "generate",
            "--prompt",
            "a house",
            "--steps",
            "3",
            "--height",
            "64",
            "--width",
            "64",
            "--model",
            str(folder),
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )

    assert code == 0 and out.stat().st_size > 0


def test_generate_with_a_missing_model_folder_exits_with_a_message(tmp_path, capsys):
    code = main(["generate", "--prompt", "x", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "x.png")])

    assert code != 0
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    "model",
    ["builtin:tiny-sdxl", "builtin:tiny-flux", "builtin:tiny-zimage", "builtin:tiny-sd3", "builtin:tiny-qwen-image"],
)
def test_generate_works_for_every_family_built_in(tmp_path, model):
    out = tmp_path / "fox.png"

    code = generate_96x64(out, model, "--seed", "3", "--steps", "2")

    assert code == 0
    with Image.open(out) as image:
        assert image.size == (96, 64)


def test_generate_draws_flux2_and_takes_an_init_image_as_its_reference_at_the_images_size(tmp_path):
    first, edited = tmp_path / "fox.png", tmp_path / "edited.png"
    Image.new("RGB", (96, 64), (200, 90, 30)).save(first)
    options = ["--model", "builtin:tiny-flux2", "--prompt", "the fox in snow", "--seed", "3", "--steps", "2"]
    options += ["--device", "cpu", "--init-image", str(first), "--out", str(edited)]

    code = main(["generate", *options])

    assert code == 0
    with Image.open(edited) as image:
        assert image.size == (96, 64), "the reference image's size"


def test_generate_takes_the_reference_image_flag_once_per_image_in_order(tmp_path, capsys):
    first, second = tmp_path / "fox.png", tmp_path / "room.png"
    Image.new("RGB", (96, 64), (200, 90, 30)).save(first)
    Image.new("RGB", (64, 80), (30, 90, 200)).save(second)
    options = ["--model", "builtin:tiny-flux2", "--prompt", "the fox in the room", "--seed", "3", "--steps", "2"]
    options += ["--device", "cpu", "--reference-image", str(first), "--reference-image", str(second)]

    drawn = main(["generate", *options, "--out", str(tmp_path / "both.png")])
    refused = main(["generate", *options, "--reference-image", str(tmp_path / "missing.png")])

    assert drawn == 0
    with Image.open(tmp_path / "both.png") as image:
        assert image.size == (96, 64), "the first image's size"
    assert refused == 2 and "--reference-image" in capsys.readouterr().err


def test_generate_refuses_a_reference_image_for_a_model_that_takes_none_naming_the_flag(tmp_path, capsys):
    picture = tmp_path / "fox.png"
    Image.new("RGB", (96, 64), (200, 90, 30)).save(picture)

    code = generate_96x64(tmp_path / "out.png", "builtin:tiny", "--reference-image", str(picture))

    assert code == 2
    assert "--reference-image" in capsys.readouterr().err


def test_generate_refuses_a_size_the_family_does_not_allow_naming_the_flag(tmp_path, capsys):
    code = main(
        [
            "generate",
            "--model",
            "builtin:tiny-flux",
            "--prompt",
            "a fox",
            "--width",
            "200",
            "--out",
            str(tmp_path / "x.png"),
        ]
    )

    assert code == 2
    assert "--width" in capsys.readouterr().err


def test_generate_with_a_cache_preset_writes_the_image_and_a_bad_cache_exits_2_naming_the_flag(tmp_path, capsys):
    out = tmp_path / "cached.png"

    assert generate_96x64(out, "builtin:tiny", "--seed", "7", "--steps", "4", "--cache", "fast") == 0
    assert generate_96x64(tmp_path / "x.png", "builtin:tiny", "--cache", "fastest") == 2

    with Image.open(out) as image:
        assert image.size == (96, 64)
    err = capsys.readouterr().err
    assert "--cache" in err and "fastest" in err
    assert not (tmp_path / "x.png").exists()


def test_generate_writes_an_mp4_of_a_video_model_with_the_frames_asked_for(tmp_path, capsys):
    out = tmp_path / "clip.mp4"

    code = main(
        ["generate", "--model", "builtin:tiny-wan", "--prompt", "a fox", "--num-frames", "9", "--out", str(out)]
        + ["--steps", "2", "--width", "96", "--height", "64", "--fps", "8"]
    )

    assert code == 0, capsys.readouterr().err
    with av.open(str(out)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        assert (len(frames), frames[0].width, frames[0].height, stream.average_rate) == (9, 96, 64, 8)


def test_generate_refuses_an_image_file_for_a_video_naming_out(tmp_path, capsys):
    code = main(["generate", "--model", "builtin:tiny-wan", "--prompt", "a fox", "--out", str(tmp_path / "x.png")])

    assert code == 2
    assert "--out" in capsys.readouterr().err
