"""The project as `pip install` gives it, outside the checkout: the wheel the images build (from the Docker
build context), installed with its engine extra into a fresh virtual environment in a temporary folder, and
run from another folder with nothing of the checkout on the path. The built-ins (tokenizer assets, the shapes
models' trained weights), the page's files and everything else the service reads must come from the
installed package.

SLOW, by design: about two and a half minutes here for the module (installing takes about 45 s: torch from pip's
local CPU build, `pip install torch==2.13.0` as `make run` does, the rest from pip's cache, no byte-compiling;
then a built-in built from scratch, a LoRA benchmark (about 45 s on a busy machine) and `stepwise up` to ready).
One environment serves the module.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from PIL import Image

from tests.support.package_build import ROOT, build_wheel
from tests.support.servers import child_env, free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.deploy

TORCH_VERSION = re.search(r"^TORCH_VERSION := (\S+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
PACKAGES = ["settings", "batching", "storage", "worker", "api", "stepwise_cli"]


class Installed:
    def __init__(self, venv: Path, home: Path) -> None:
        self.venv = venv
        self.home = home  # another folder: the commands run here, with their own cache of built-ins
        self.cache = home / "cache"

    def env(self, **overrides: str) -> dict[str, str]:
        env = child_env(STEPWISE_CACHE_DIR=str(self.cache), OMP_NUM_THREADS="1", **overrides)
        for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
            env.pop(name, None)
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env['PATH']}"
        return env

    def run(self, *argv: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.venv / "bin" / argv[0]), *argv[1:]],
            cwd=self.home,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    folder = tmp_path_factory.mktemp("installed")
    wheel = build_wheel("docker/worker.Dockerfile", folder / "dist")
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet", "--no-compile"]
        + [f"torch=={TORCH_VERSION}", f"{wheel}[engine]"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    home = folder / "elsewhere"
    home.mkdir()
    return Installed(venv, home)


def test_the_installed_command_says_the_projects_version(installed):
    result = installed.run("stepwise", "--version")

    assert result.returncode == 0 and result.stdout.strip() == "stepwise 0.1.0", result


def test_every_package_and_the_pages_files_load_from_the_installed_package_not_the_checkout(installed):
    probe = f"import importlib, json; print(json.dumps([importlib.import_module(p).__file__ for p in {PACKAGES!r}]))"
    result = installed.run("python", "-c", probe)

    assert result.returncode == 0, result.stderr
    locations = [Path(path) for path in json.loads(result.stdout)]
    assert all(installed.venv in path.parents for path in locations), locations
    assert (locations[PACKAGES.index("api")].parent / "static" / "index.html").is_file()


def test_generate_draws_a_built_in_built_from_the_installed_assets(installed):
    out = installed.home / "fox.png"
    result = installed.run(
        "stepwise", "generate", "--model", "builtin:tiny", "--prompt", "a red fox", "--steps", "2",
        "--height", "64", "--width", "64", "--seed", "1", "--out", str(out),
    )  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    with Image.open(out) as image:
        assert image.size == (64, 64)
    assert (installed.cache / "builtin-tiny-v1").is_dir()  # built just now, from the package's tokenizer assets


def test_a_lora_benchmark_runs_from_the_installed_package_with_its_random_adapters(installed):
    """The LoRA benchmarks once imported `tests.support`, which the wheel does not ship; their random adapters now
    come from `benchmarks.random_loras`. The quicker of the two runs here (lora_mix's three engine processes took
    minutes from a fresh install on a busy machine); that no shipped package imports `tests` at all, lazily or not,
    is tests/test_layering.py's."""
    forward = installed.run("python", "-m", "benchmarks.lora_forward", "--rows", "5", "--repeats", "1")

    assert forward.returncode == 0, forward.stdout + forward.stderr
    assert "largest difference, per-row deltas vs PEFT: " in forward.stdout


@pytest.mark.workers
def test_stepwise_up_from_another_folder_becomes_ready_serves_the_page_and_draws_a_shape(installed):
    port, redis_port = free_port(), free_port()
    log_path = installed.home / "up.log"
    with log_path.open("wb") as log:
        up = subprocess.Popen(
            [str(installed.venv / "bin" / "stepwise"), "up", "--port", str(port), "--redis-port", str(redis_port)],
            cwd=installed.home,
            env=installed.env(STEPWISE_SHUTDOWN_GRACE="2"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def ready() -> bool:
            assert up.poll() is None, f"stepwise up exited:\n{log_path.read_text()[-4000:]}"
            return "stepwise is up" in log_path.read_text()

        wait_for(ready, 300, lambda: f"stepwise up to be ready:\n{log_path.read_text()[-4000:]}", interval=0.5)
        page = requests.get(f"http://127.0.0.1:{port}/", timeout=10)
        submitted = installed.run("stepwise", "submit", "a red circle on a blue background", "--wait", "--out", "out")
    finally:
        up.send_signal(signal.SIGTERM)
        stopped = up.wait(120)

    assert page.status_code == 200 and "<html" in page.text
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr + log_path.read_text()[-3000:]
    (drawn,) = (installed.home / "out").glob("*.png")
    with Image.open(drawn) as image:  # builtin:shapes, `up`'s default, from the weights the package ships
        assert image.size == (128, 128)
    assert stopped == 0
