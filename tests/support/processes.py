"""Real processes for the tests: `stepwise api` and the one worker process class, which
the API tests start themselves and the worker tests' `Cluster` starts for them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Self

import requests

from tests.support import tiers
from tests.support.servers import child_env, free_port
from tests.support.waiting import wait_for
from tests.support.worker_forks import ForkedProcess, forked

ROOT = Path(__file__).resolve().parents[2]
TENANT_KEYS = {"alice": "sk_test_alice", "bob": "sk_test_bob", "carol": "sk_test_carol"}
ADMIN_KEYS = {"ops": "sk_test_ops_admin"}  # STEPWISE_ADMIN_API_KEYS: /metrics, /v1/admin
WEBHOOK_SECRET = "whsec_" + "c3Rlc3dpc2UtdGVzdC13ZWJob29rLXNlY3JldA=="  # base64 of a test secret


def api_keys_setting() -> str:
    return ",".join(f"{tenant}:{key}" for tenant, key in TENANT_KEYS.items())


class ChildProcess:
    """A child process in its own process group, logging to a file the failure message shows. Only a test with
    the subclass's tier marker (`tier`, tests/support/tiers.py) may start one."""

    tier: str

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen | ForkedProcess | None = None

    def launch(self) -> Self:
        """Start the process without waiting (start several, then `wait_ready` each)."""
        tiers.require(self.tier, self.name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = self.popen()
        return self

    def popen(self) -> subprocess.Popen | ForkedProcess:
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                self.argv, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def start(self, timeout: float | None = None) -> Self:
        """Start the process and wait until it is ready (`wait_ready`, with its own default timeout)."""
        self.launch()
        return self.wait_ready() if timeout is None else self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 30.0) -> Self:
        raise NotImplementedError

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, num_chars: int = 4000) -> str:
        return self.log_text()[-num_chars:]

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def assert_running(self) -> None:
        code = self.process and self.process.returncode
        assert self.is_alive(), f"{self.name} exited with {code}:\n{self.log_tail()}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Send `sig` to the process group and wait; past `timeout`, kill it. Returns the exit code (None if it
        never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


class ApiProcess(ChildProcess):
    """`stepwise api` on a free loopback port."""

    tier = tiers.E2E

    def __init__(
        self,
        tmp_dir: Path,
        redis_url: str,
        storage_url: str,
        *,
        workers: int = 2,
        access_log: bool = False,
        **env_overrides: str,
    ) -> None:
        self.port = free_port()
        defaults = {
            "STEPWISE_REDIS_URL": redis_url,
            "STEPWISE_STORAGE_URL": storage_url,
            "STEPWISE_API_KEYS": api_keys_setting(),
            "STEPWISE_ADMIN_API_KEYS": ",".join(f"{tenant}:{key}" for tenant, key in ADMIN_KEYS.items()),
            "STEPWISE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
            "STEPWISE_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "STEPWISE_VAR_DIR": str(tmp_dir / "var"),
            # Most API tests run without a worker: jobs for builtin:tiny queue as they would for an
            # autoscaled fleet. tests/api/test_fleet.py runs with the default (refuse unserved models).
            "STEPWISE_ACCEPT_UNSERVED_MODELS": "true",
        }
        env = child_env(**{**defaults, **env_overrides})  # the test's settings win
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        argv = [
            sys.executable,
            "-m",
            "stepwise_cli.main",
            "api",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            str(workers),
            "--threads",
            "4",
            *(["--access-log"] if access_log else []),
        ]
        super().__init__("stepwise api", argv, env, tmp_dir / "api.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 30.0) -> Self:
        def healthy() -> bool:
            self.assert_running()
            try:
                return requests.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except (requests.ConnectionError, requests.Timeout):  # workers still booting on a busy machine
                return False

        try:
            wait_for(healthy, timeout, "stepwise api to answer /healthz")
        except AssertionError:
            self.stop()
            raise TimeoutError(f"stepwise api did not answer /healthz within {timeout}s:\n{self.log_tail()}") from None
        return self


class WorkerProcess(ChildProcess):
    """A real worker process on the CPU, for the generate and webhook queues (builtin:tiny unless the
    environment names another model). API tests take the threads pool and the defaults below; the
    worker tests' `Cluster` passes `pool=None`, so the app's own pool, concurrency and prefetch are
    what runs, or `via_stepwise=True` to start it as `stepwise worker` does."""

    tier = tiers.WORKERS

    def __init__(
        self,
        tmp_dir: Path,
        redis_url: str,
        storage_url: str,
        *,
        label: str = "worker",
        queues: str = "stepwise.generate,stepwise.webhooks",
        pool: str | None = "threads",
        via_stepwise: bool = False,
        stepwise_args: tuple[str, ...] = (),
        **env_overrides: str,
    ) -> None:
        self.metrics_port = int(env_overrides.get("STEPWISE_WORKER_METRICS_PORT") or free_port())
        defaults = dict(
            STEPWISE_REDIS_URL=redis_url,
            STEPWISE_STORAGE_URL=storage_url,
            STEPWISE_MODEL="builtin:tiny",
            STEPWISE_DEVICE="cpu",
            STEPWISE_MAX_NUM_SEQS="4",
            STEPWISE_WEBHOOK_SECRET=WEBHOOK_SECRET,
            STEPWISE_WEBHOOK_ALLOW_HOSTS="127.0.0.1",
            STEPWISE_WEBHOOK_BACKOFF="0.2",
            STEPWISE_WORKER_METRICS_PORT=str(self.metrics_port),
        )
        env = child_env(**{**defaults, **env_overrides})  # the test's settings win
        name = f"{label}-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"  # its Celery node name: `self.name`
        if via_stepwise:
            argv = [str(Path(sys.executable).with_name("stepwise")), "worker", "--hostname", name, *stepwise_args]
        else:
            argv = [sys.executable, "-m", "celery", "-A", "worker", "worker", "-Q", queues]
            argv += [*(["--pool", pool] if pool else []), "--loglevel", "INFO", "--hostname", name]
        super().__init__(name, argv, env, tmp_dir / f"{label}.log")

    def popen(self) -> subprocess.Popen | ForkedProcess:
        return forked(self.argv, self.env, self.log_path) or super().popen()  # a fork where that is the same process

    def wait_ready(self, timeout: float = 120.0) -> Self:
        def ready() -> bool:
            self.assert_running()
            return " ready." in self.log_tail(20_000)

        try:
            wait_for(ready, timeout, "the worker to log that it is ready", interval=0.2)
        except AssertionError:
            self.stop()
            raise AssertionError(f"the worker was not ready within {timeout}s:\n{self.log_tail()}") from None
        return self
