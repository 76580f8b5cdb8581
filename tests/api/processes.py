"""Real processes for the API tests: `stepwise api` (its default server) and a Celery worker."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from stepwise_cli.api_cmd import DEFAULT_SERVER
from tests.servers import child_env, free_port

ROOT = Path(__file__).resolve().parents[2]
TENANT_KEYS = {"alice": "sk_test_alice", "bob": "sk_test_bob", "carol": "sk_test_carol"}
ADMIN_KEYS = {"ops": "sk_test_ops_admin"}  # STEPWISE_ADMIN_API_KEYS: /metrics, /v1/admin
WEBHOOK_SECRET = "whsec_" + "c3Rlc3dpc2UtdGVzdC13ZWJob29rLXNlY3JldA=="  # base64 of a test secret


def api_keys_setting() -> str:
    return ",".join(f"{tenant}:{key}" for tenant, key in TENANT_KEYS.items())


class ChildProcess:
    """A child process in its own process group, logging to a file the failure message shows."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log_tail(self, num_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except FileNotFoundError:
            return ""

    def assert_running(self) -> None:
        assert self.process is not None and self.process.poll() is None, (
            f"{self.name} exited with {self.process and self.process.returncode}:\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


class ApiProcess(ChildProcess):
    """`stepwise api` on a free loopback port, with its default server unless `server` names one."""

    def __init__(
        self,
        tmp_dir: Path,
        redis_url: str,
        storage_url: str,
        *,
        workers: int = 2,
        access_log: bool = False,
        server: str | None = None,
        **env_overrides: str,
    ) -> None:
        self.port = free_port()
        self.server = server or DEFAULT_SERVER
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
            **({"STEPWISE_API_SERVER": server} if server else {}),
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

    def start(self, timeout: float = 30.0) -> ApiProcess:
        super().start()
        return self.wait_ready(timeout)

    def launch(self) -> ApiProcess:
        """Start the process without waiting (start several, then `wait_ready` each)."""
        super().start()
        return self

    def wait_ready(self, timeout: float = 30.0) -> ApiProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.assert_running()
            try:
                if requests.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return self
            except (requests.ConnectionError, requests.Timeout):  # workers still booting on a busy machine
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"stepwise api did not answer /healthz within {timeout}s:\n{self.log_tail()}")


class WorkerProcess(ChildProcess):
    """A Celery worker (threads pool) for both queues, with the built-in tiny model on the CPU."""

    def __init__(
        self,
        tmp_dir: Path,
        redis_url: str,
        storage_url: str,
        *,
        queues: str = "stepwise.generate,stepwise.webhooks",
        **env_overrides: str,
    ) -> None:
        defaults = dict(
            STEPWISE_REDIS_URL=redis_url,
            STEPWISE_STORAGE_URL=storage_url,
            STEPWISE_MODEL="builtin:tiny",
            STEPWISE_DEVICE="cpu",
            STEPWISE_MAX_NUM_SEQS="4",
            STEPWISE_WEBHOOK_SECRET=WEBHOOK_SECRET,
            STEPWISE_WEBHOOK_ALLOW_HOSTS="127.0.0.1",
            STEPWISE_WEBHOOK_BACKOFF="0.2",
            STEPWISE_WORKER_METRICS_PORT="0",
        )
        env = child_env(**{**defaults, **env_overrides})  # the test's settings win
        self.hostname = f"api-test-{free_port()}@{socket.gethostname()}"
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker",
            "worker",
            "-Q",
            queues,
            "--pool",
            "threads",
            "--loglevel",
            "INFO",
            "--hostname",
            self.hostname,
        ]
        super().__init__("celery worker", argv, env, tmp_dir / "worker.log")

    def start(self, timeout: float = 120.0) -> WorkerProcess:
        super().start()
        return self.wait_ready(timeout)

    def launch(self) -> WorkerProcess:
        """Start the process without waiting (start several, then `wait_ready` each)."""
        super().start()
        return self

    def wait_ready(self, timeout: float = 120.0) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.assert_running()
            if " ready." in self.log_tail(20_000):
                return self
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"the worker was not ready within {timeout}s:\n{self.log_tail()}")
