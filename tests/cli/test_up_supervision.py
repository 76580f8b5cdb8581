"""`stepwise up` as a supervisor: an external Redis, a missing redis-server, a child that dies and is restarted."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest
import requests

from tests.support.servers import child_env, free_port, wait_until_gone
from tests.support.waiting import wait_for

pytestmark = pytest.mark.workers

STEPWISE = [sys.executable, "-m", "stepwise_cli.main"]


def test_a_missing_redis_server_is_explained_with_how_to_install_it(tmp_path):
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    result = subprocess.run(
        [*STEPWISE, "up", "--var-dir", str(tmp_path / "var")],
        cwd=tmp_path,
        env=child_env(PATH=str(empty_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "redis-server is not installed" in result.stderr
    assert "apt-get install redis-server" in result.stderr


def test_with_an_external_redis_up_starts_none_and_restarts_a_child_that_was_killed(redis_url, tmp_path):
    var_dir = tmp_path / "var"
    log_path = tmp_path / "up.log"
    port = free_port()
    with log_path.open("wb") as log:
        up = subprocess.Popen(
            [*STEPWISE, "up", "--port", str(port), "--var-dir", str(var_dir), "--api-workers", "1"],
            cwd=tmp_path,
            env=child_env(STEPWISE_REDIS_URL=redis_url, STEPWISE_SHUTDOWN_GRACE="5", STEPWISE_MODEL="builtin:tiny"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    children: list[psutil.Process] = []
    try:

        def ready() -> bool:
            assert up.poll() is None, log_path.read_text()
            return (var_dir / "stepwise.json").exists()

        wait_for(ready, 240, lambda: f"stepwise up to be ready:\n{log_path.read_text()}", interval=0.2)
        children = psutil.Process(up.pid).children(recursive=True)
        command_lines = [" ".join(child.cmdline()) for child in children]
        assert not any("redis-server" in line for line in command_lines)

        api = next(child for child in psutil.Process(up.pid).children() if " api " in " ".join(child.cmdline()) + " ")
        api.send_signal(signal.SIGKILL)
        wait_for(
            lambda: "restarted api" in log_path.read_text() and answers(f"http://127.0.0.1:{port}/healthz"),
            90,
            lambda: f"the API to be restarted and answer again:\n{log_path.read_text()[-3000:]}",
        )
        assert "api was killed by SIGKILL" in log_path.read_text() and up.poll() is None

        children = psutil.Process(up.pid).children(recursive=True)
        up.send_signal(signal.SIGTERM)
        assert up.wait(90) == 0
        alive = wait_until_gone(children, timeout=10)
        assert not alive, [child.cmdline() for child in alive]
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        for child in children:
            if child.is_running():
                child.kill()


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
