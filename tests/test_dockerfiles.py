"""docker/*.Dockerfile cannot be built here (no container runtime): read them, and build what their wheel stage
builds. Each image must be the project's wheel installed by pip: every file an instruction copies exists in the
build context .dockerignore leaves, and the wheel built from that context holds every package and data file
the project declares (pyproject.toml), so no image can miss one the way a hand-written COPY list did."""

from __future__ import annotations

import re
import tomllib
import zipfile
from pathlib import Path

import pytest
from setuptools import find_packages

from tests.support.package_build import ROOT, Dockerfile, build_context, build_wheel

pytestmark = pytest.mark.deploy

DOCKERFILES = ["docker/api.Dockerfile", "docker/worker.Dockerfile"]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The CUDA version of PyPI's Linux wheel of each torch the worker image may pin: its metadata requires
# cuda-toolkit 13.0.3 for 2.13.0 (read with `pip install --dry-run --report` for manylinux_2_28_x86_64).
PYPI_TORCH_CUDA = {"2.13.0": "13.0"}


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory) -> set[str]:
    wheel = build_wheel(DOCKERFILES[0], tmp_path_factory.mktemp("wheel"))
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def declared_files() -> set[str]:
    """What pyproject.toml says the wheel holds: each package setuptools finds with its `include` patterns
    (its modules), and the package data its globs match."""
    found = find_packages(str(ROOT), include=PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"])
    files = {
        str(path.relative_to(ROOT)) for package in found for path in (ROOT / package.replace(".", "/")).glob("*.py")
    }
    for package, globs in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        for pattern in globs:
            files |= {str(path.relative_to(ROOT)) for path in (ROOT / package).glob(pattern) if path.is_file()}
    return {name for name in files if "__pycache__" not in name}


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_file_a_dockerfile_copies_from_the_build_context_is_in_it(dockerfile):
    context = build_context(dockerfile)
    stages = Dockerfile.read(ROOT / dockerfile).stages

    for index, stage in enumerate(stages):
        for rest in stage.arguments("COPY"):
            *sources, _ = rest.split()
            if sources[0].startswith("--from="):
                earlier = {s.name for s in stages[:index]}
                assert sources[0].removeprefix("--from=") in earlier, f"{dockerfile}: COPY {rest}: no such stage"
                continue
            for source in sources:
                assert source == "." or source.rstrip("/") in context, f"{dockerfile}: COPY {source}: not in context"
    assert {"pyproject.toml", "README.md"} <= context  # what `pip wheel .` reads besides the packages


def test_the_build_context_holds_every_file_the_wheel_declares_and_no_local_state():
    context = build_context(DOCKERFILES[0])

    assert declared_files() - context == set(), "left out by .dockerignore"
    assert not {".env", ".venv", "var", ".git"} & context


def test_the_wheel_built_from_the_build_context_holds_every_package_and_data_file_declared(wheel_files):
    missing = declared_files() - wheel_files

    assert missing == set(), f"the images would lack: {sorted(missing)[:10]}"
    assert {"settings/__init__.py", "batching/assets/builtin-shapes/model_index.json", "api/static/index.html"} <= (
        wheel_files
    )


@pytest.mark.parametrize(("dockerfile", "extras"), [(DOCKERFILES[0], "${EXTRAS}"), (DOCKERFILES[1], "[engine]")])
def test_each_image_installs_the_wheel_its_own_wheel_stage_built(dockerfile, extras):
    image = Dockerfile.read(ROOT / dockerfile)
    wheel_stage, final = image.stages[0], image.final

    assert wheel_stage.name == "wheel" and wheel_stage.arguments("COPY") == [". ."]
    assert any(
        re.fullmatch(r"pip wheel .*--no-deps --wheel-dir /wheels \.", run) for run in wheel_stage.arguments("RUN")
    )
    assert "--from=wheel /wheels /wheels" in final.arguments("COPY")
    installs = [run for run in final.arguments("RUN") if "/wheels/stepwise-*.whl" in run]
    assert len(installs) == 1 and f'"$(echo /wheels/stepwise-*.whl){extras}"' in installs[0]
    assert not [rest for rest in final.arguments("COPY") if not rest.startswith("--from=")], "files beside the wheel"
    assert final.arguments("USER") == ["stepwise"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_each_image_runs_a_python_the_project_supports(dockerfile):
    image = Dockerfile.read(ROOT / dockerfile)
    minimum = tuple(
        int(part) for part in re.search(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"]).groups()
    )
    final_base = image.expand(image.final.base)

    if final_base.startswith("python:"):
        version = re.match(r"python:(\d+)\.(\d+)", final_base).groups()
    else:  # a CUDA image: Ubuntu's python3 (24.04: 3.12)
        assert final_base.endswith("-ubuntu24.04"), final_base
        version = ("3", "12")
    assert tuple(int(part) for part in version) >= minimum


def test_the_worker_image_takes_torch_where_its_pinned_version_exists_on_the_matching_cuda_base():
    image = Dockerfile.read(ROOT / DOCKERFILES[1])
    makefile_pin = re.search(r"^TORCH_VERSION := (\S+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    torch = image.args["TORCH_VERSION"]

    assert torch == makefile_pin
    assert image.args["TORCH_INDEX_URL"] == "https://pypi.org/simple"  # PyPI's default Linux wheel: a CUDA build
    assert torch in PYPI_TORCH_CUDA, f"record the CUDA version of PyPI's torch {torch} wheel (its metadata says)"
    assert re.fullmatch(
        rf"nvidia/cuda:{re.escape(PYPI_TORCH_CUDA[torch])}\.\d+-base-ubuntu24\.04", image.args["CUDA_IMAGE"]
    )
    torch_installs = [run for run in image.final.arguments("RUN") if '"torch==${TORCH_VERSION}"' in run]
    assert torch_installs and all("--index-url" in run or "[engine]" in run for run in torch_installs)


def test_compose_builds_every_stepwise_service_from_these_dockerfiles():
    compose = (ROOT / "docker-compose.yml").read_text()
    named = set(re.findall(r"dockerfile: (docker/\S+?)[,}]", compose))

    assert named == set(DOCKERFILES)
    assert all(Path(ROOT / name).exists() for name in named)
