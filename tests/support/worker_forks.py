"""Worker processes started as forks of a process that has imported their libraries already
(`tests.support.fork_server`): a worker's start costs about 1 CPU-second instead of 10 here, and the suite
starts some fifty.

What runs is what the operator's command runs: `python -m celery -A worker worker ...`, with the test's
arguments and environment, in its own session, logging to its file, the project's own packages imported
afresh. The one difference is that the third-party libraries were imported before the worker's environment was
set, so a fork is used only where that cannot matter: the command is `sys.executable -m celery`, and the
environment differs from the server's only in variables no library reads when imported (`READ_WHEN_USED`:
STEPWISE_* settings, AWS_* credentials, pytest's PYTEST_CURRENT_TEST). Anything else
(`stepwise worker`, another interpreter, another OMP_NUM_THREADS), a server that is not single-threaded, or
TESTS_FORK_WORKERS=0 in the tests' environment starts the process with `subprocess.Popen` as before.

`ForkedProcess` answers what the tests ask of a `Popen`: pid, poll, wait, returncode. The process is the
server's child, so its exit code comes from the server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.servers import child_env

ROOT = Path(__file__).resolve().parents[2]
WORKER_COMMAND = [sys.executable, "-m", "celery"]  # what a fork runs (`tests.support.fork_server.run_child`)


class ForkServer:
    def __init__(self) -> None:
        self.env = child_env()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.fork_server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=self.env,
        )
        self._lock = threading.Lock()
        self.is_single_threaded = self._read()["threads"] == 1

    def can_start(self, argv: list[str], env: dict[str, str]) -> bool:
        return self.is_single_threaded and self.process.poll() is None and is_same_process(argv, env, self.env)

    def start(self, argv: list[str], env: dict[str, str], log_path: Path) -> ForkedProcess:
        request = {"argv": argv, "env": env, "cwd": str(ROOT), "log": str(log_path)}
        reply = self.ask({"start": request})
        if "error" in reply:
            raise OSError(f"the fork server could not start {argv}: {reply['error']}")
        return ForkedProcess(self, reply["pid"])

    def ask(self, request: dict) -> dict:
        with self._lock:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            return self._read()

    def _read(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise OSError(f"the fork server exited with {self.process.wait()}")
        return json.loads(line)


class ForkedProcess:
    """The part of `subprocess.Popen` the tests use, for a process the fork server started."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            reply = self.server.ask({"poll": self.pid})
            if "error" in reply:
                raise OSError(reply["error"])
            self.returncode = reply["code"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["worker", str(self.pid)], timeout or 0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode


_server: ForkServer | None = None
_server_lock = threading.Lock()


def forked(argv: list[str], env: dict[str, str], log_path: Path) -> ForkedProcess | None:
    """`argv` started as a fork of the fork server, logging to `log_path`, where that is the same process as
    `Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=STDOUT, start_new_session=True)`; else None (the caller
    starts it so)."""
    if os.environ.get("TESTS_FORK_WORKERS", "1") == "0" or argv[:3] != WORKER_COMMAND:
        return None  # and no server for a test process that starts no such worker
    server = fork_server()
    return server.start(argv, env, log_path) if server.can_start(argv, env) else None


def fork_server() -> ForkServer:
    global _server
    with _server_lock:
        if _server is None or _server.process.poll() is not None:
            _server = ForkServer()
        return _server


# Read when used, never when a library is imported: the worker's settings, boto3's credentials and region (read
# when a client is made), and what pytest sets for the test that runs.
READ_WHEN_USED = ("STEPWISE_", "AWS_", "PYTEST_CURRENT_TEST")


def is_same_process(argv: list[str], env: dict[str, str], server_env: dict[str, str]) -> bool:
    """Whether `argv` started with `env` is what a fork of a server started with `server_env` runs."""
    return argv[:3] == WORKER_COMMAND and read_at_import(env) == read_at_import(server_env)


def read_at_import(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if not name.startswith(READ_WHEN_USED)}
