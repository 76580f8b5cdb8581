"""`stepwise up` as a test runs it: on free ports in its own folder, with its log kept, and helpers to reach the
service it started (`tests/cli/up/conftest.py` starts one for that folder's tests)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

from tests.support import tiers
from tests.support.servers import child_env, free_port
from tests.support.waiting import wait_for

STARTUP_TIMEOUT = 240
STEPWISE = [sys.executable, "-m", "stepwise_cli.main"]
TINY = ["--size", "64", "--steps", "4"]


class UpProcess:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.var_dir = workdir / "var"
        self.api_port = free_port()
        self.redis_port = free_port()
        self.log_path = workdir / "up.log"
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start(self) -> UpProcess:
        tiers.require(tiers.WORKERS, "stepwise up")
        self.started_at = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    *STEPWISE,
                    "up",
                    "--port",
                    str(self.api_port),
                    "--redis-port",
                    str(self.redis_port),
                    "--var-dir",
                    str(self.var_dir),
                    "--max-num-seqs",
                    "4",
                    "--api-workers",
                    "1",
                ],
                cwd=self.workdir,
                env=child_env(STEPWISE_SHUTDOWN_GRACE="5", STEPWISE_MODEL="builtin:tiny"),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def ready() -> bool:
            assert self.process.poll() is None, f"stepwise up exited early:\n{self.log()}"
            return (self.var_dir / "stepwise.json").exists()

        wait_for(ready, STARTUP_TIMEOUT, lambda: f"stepwise up to be ready:\n{self.log()}", interval=0.2)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def run_cli(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*STEPWISE, *args], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout)


def api_call(up: UpProcess, method: str, path: str, **kwargs) -> dict:
    saved = json.loads((up.var_dir / "stepwise.json").read_text())
    response = requests.request(
        method, saved["api_url"] + path, headers={"Authorization": f"Bearer {saved['api_key']}"}, timeout=10, **kwargs
    )
    assert response.status_code < 300, response.text
    return response.json()


def readme_block(containing: str, language: str = "sh") -> str:
    """The README's ```sh (or other `language`) block that contains `containing`, as a user would paste it."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(rf"```{language}\n(.*?)```", readme, flags=re.S)
    return next(block for block in blocks if containing in block)
