"""One service per folder: a second `stepwise up` (or `make run`) beside the running one exits at once naming it
and changes nothing; `make run PORT=...` and STEPWISE_API_PORT choose the API's port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.servers import child_env, free_port
from tests.support.up_process import STEPWISE

pytestmark = [pytest.mark.workers, pytest.mark.xdist_group("stepwise-up")]  # the folder's one `up`

REPO = Path(__file__).resolve().parents[3]


def make_run(*variables: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`make run` as a user types it, with this test run's venv (`-o`: never reinstall it here)."""
    venv = Path(sys.prefix)
    return subprocess.run(
        ["make", "-s", "-C", str(REPO), "-o", str(venv / ".installed"), "run", f"VENV={venv}", *variables],
        cwd=cwd,
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_up_in_the_folder_of_a_running_one_exits_at_once_naming_it_and_changes_nothing(up):
    state_before = (up.var_dir / "stepwise.json").read_bytes()
    started = time.monotonic()

    second = subprocess.run(
        [*STEPWISE, "up", "--var-dir", str(up.var_dir), "--port", str(free_port()), "--redis-port", str(free_port())],
        cwd=up.workdir,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert second.returncode == 1 and time.monotonic() - started < 20, second.stdout + second.stderr
    said = second.stderr
    assert "a `stepwise up` already runs from this folder" in said
    assert f"pid {up.process.pid}" in said and f"API http://127.0.0.1:{up.api_port}" in said, said
    assert (up.var_dir / "stepwise.json").read_bytes() == state_before
    assert "[redis]" not in second.stdout  # it started nothing


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_in_the_folder_of_a_running_up_is_refused_the_same_way(up):
    second = make_run(f"PORT={free_port()}", cwd=up.workdir, STEPWISE_VAR_DIR=str(up.var_dir))

    assert second.returncode != 0
    assert f"a `stepwise up` already runs from this folder (pid {up.process.pid}" in second.stderr, second.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("how", ["make run PORT", "STEPWISE_API_PORT"])
def test_the_api_port_is_chosen_with_make_run_port_or_stepwise_api_port(tmp_path, how):
    with socket.create_server(("127.0.0.1", 0)) as taken:  # the port asked for is busy: up says so, naming it
        port = taken.getsockname()[1]
        var_dir = str(tmp_path / "var")
        if how == "make run PORT":
            result = make_run(f"PORT={port}", cwd=tmp_path, STEPWISE_VAR_DIR=var_dir)
        else:
            result = subprocess.run(
                [*STEPWISE, "up"],
                cwd=tmp_path,
                env=child_env(STEPWISE_API_PORT=str(port), STEPWISE_VAR_DIR=var_dir),
                capture_output=True,
                text=True,
                timeout=60,
            )

    assert result.returncode != 0
    other = port + 1
    assert f"stepwise up: port {port} on 127.0.0.1 is in use; choose another: `stepwise up --port {other}`, " in (
        result.stderr
    )
    assert f"`make run PORT={other}`, or STEPWISE_API_PORT={other}" in result.stderr
