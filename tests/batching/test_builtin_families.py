"""The built-in models of every family but SD: built offline, reproducible, and usable by diffusers itself."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import (
    Flux2Pipeline,
    FluxPipeline,
    QwenImagePipeline,
    StableDiffusion3Pipeline,
    StableDiffusionXLPipeline,
    WanImageToVideoPipeline,
    WanPipeline,
    ZImagePipeline,
)
from PIL import Image

from batching.builtin_model import (
    build_builtin_pipeline,
    builtin_family,
    builtin_model_path,
    main,
    save_builtin_model,
)
from batching.pipelines import adapter_serving


@dataclass(frozen=True)
class FamilyCase:
    model: str
    family: str
    pipeline_class: type
    size: int  # the smallest size the family handles well: a multiple of its latent patch and VAE factor


CASES = [
    FamilyCase("builtin:tiny-sdxl", "sdxl", StableDiffusionXLPipeline, 64),
    FamilyCase("builtin:tiny-flux", "flux", FluxPipeline, 64),
    FamilyCase("builtin:tiny-zimage", "zimage", ZImagePipeline, 64),
    FamilyCase("builtin:tiny-qwen-image", "qwenimage", QwenImagePipeline, 64),
    FamilyCase("builtin:tiny-sd3", "sd3", StableDiffusion3Pipeline, 64),
    FamilyCase("builtin:tiny-flux2", "flux2", Flux2Pipeline, 64),
    FamilyCase("builtin:tiny-wan", "wan", WanPipeline, 64),
    FamilyCase("builtin:tiny-wan-i2v", "wan", WanImageToVideoPipeline, 64),
    FamilyCase("builtin:tiny-wan22", "wan", WanPipeline, 64),
]


def _weights(pipeline) -> dict[str, torch.Tensor]:
    return {
        f"{name}.{key}": tensor
        for name, component in pipeline.components.items()
        if isinstance(component, torch.nn.Module)
        for key, tensor in component.state_dict().items()
    }


def _generate(pipeline, case: FamilyCase, prompt: str) -> np.ndarray:
    video: dict = {}  # a video pipeline's: a few frames (and a first frame), of which the first is compared
    if case.family == "wan":
        video = {"num_frames": 5, "output_type": "pil"}
        if case.pipeline_class is WanImageToVideoPipeline:
            video["image"] = Image.new("RGB", (case.size, case.size), (200, 30, 30))
    output = pipeline(
        prompt=prompt,  # by name: Flux2Pipeline's first argument is its reference image
        num_inference_steps=4,
        height=case.size,
        width=case.size,
        generator=torch.Generator().manual_seed(7),
        **video,
    )
    image = output.frames[0][0] if video else output.images[0]
    assert image.size == (case.size, case.size)
    return np.asarray(image)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STEPWISE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.model)
def test_building_twice_gives_identical_files_that_load_back_exactly(case, tmp_path):
    first = save_builtin_model(case.model, tmp_path / "first")
    torch.manual_seed(12345)
    second = save_builtin_model(case.model, tmp_path / "second")

    files = sorted(path.relative_to(first) for path in first.rglob("*") if path.is_file())
    assert files == sorted(path.relative_to(second) for path in second.rglob("*") if path.is_file())
    assert all((first / name).read_bytes() == (second / name).read_bytes() for name in files)

    loaded = _weights(case.pipeline_class.from_pretrained(first, local_files_only=True))
    built = _weights(build_builtin_pipeline(case.model))
    assert loaded.keys() == built.keys()
    assert all(torch.equal(loaded[key], built[key]) for key in built)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.model)
def test_the_build_command_prints_a_cached_folder_of_the_family_pipeline(case, cache, capsys):
    assert main([case.model]) == 0

    folder = Path(capsys.readouterr().out.strip())
    assert folder == builtin_model_path(case.model)
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == case.pipeline_class.__name__
    assert builtin_family(case.model) == case.family
    assert adapter_serving(case.model, str(folder)).family == case.family  # the adapter that declares the class


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.model)
def test_diffusers_own_pipeline_generates_the_same_image_for_the_same_seed(case, cache):
    pipeline = case.pipeline_class.from_pretrained(builtin_model_path(case.model), local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)

    first = _generate(pipeline, case, "a red fox in the forest")
    again = _generate(pipeline, case, "a red fox in the forest")
    other_prompt = _generate(pipeline, case, "a blue boat on the sea")

    assert (first == again).all()
    assert (first != other_prompt).any(), "the prompt must change the image"


def test_naming_a_builtin_and_its_family_does_not_import_torch():
    """The torch-free family table and the API can ask which built-ins exist without loading a model stack."""
    code = (
        "import json, sys\n"
        "from core.builtin_models import builtin_family, builtin_names\n"
        "print(json.dumps({'families': {name: builtin_family(name) for name in builtin_names()},"
        " 'torch_imported': 'torch' in sys.modules}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    answer = json.loads(done.stdout)

    assert answer["torch_imported"] is False
    assert {case.model: case.family for case in CASES}.items() <= answer["families"].items()
