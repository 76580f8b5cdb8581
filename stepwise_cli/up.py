"""`stepwise up`: the whole service on one machine, with embedded defaults.

Children, each in its own process group (so a stop reaches gunicorn's workers and nothing
is left behind) and each told to die with this process if it is killed outright:
redis-server (unless STEPWISE_REDIS_URL names one; append-only data under `<var>/redis`),
`stepwise worker` and `stepwise api`. Their configuration travels in `STEPWISE_*`
variables; their log lines come out prefixed with the child's name.

Ctrl-C or SIGTERM stops the children in reverse order (api, worker with a warm shutdown,
redis), each with SIGTERM and then SIGKILL after a timeout; a second Ctrl-C kills at once.
A child that dies on its own stops everything, with exit status 1.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import redis
import requests

from stepwise_cli.client import ApiTarget, default_var_dir, load_local_target, save_local_target

LOCAL_TENANT = "local"
REDIS_MISSING = """\
stepwise up: redis-server is not installed, and STEPWISE_REDIS_URL does not name a running Redis.
Install it with one of:
    sudo apt-get install redis-server        # Debian, Ubuntu
    brew install redis                       # macOS
    sudo dnf install redis                   # Fedora
or run `make run`, which installs it when it can; or set STEPWISE_REDIS_URL=redis://HOST:PORT/0.
"""


class ServiceError(Exception):
    """A child could not start, did not become ready in time, or died."""


class StopRequested(Exception):
    """Ctrl-C or SIGTERM arrived."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="API address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="API port (default 8000)")
    parser.add_argument("--model", help="model for the worker (default: $STEPWISE_MODEL or builtin:tiny)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: $STEPWISE_DEVICE, else cpu)")
    parser.add_argument("--max-num-seqs", type=int, help="jobs the worker batches at once (default: the worker's)")
    parser.add_argument("--api-workers", type=int, default=2,
                        help="gunicorn worker processes for the API (default 2: the model needs the CPU more)")
    parser.add_argument("--redis-port", type=int, help="port for the embedded redis-server (default: a free one)")
    parser.add_argument("--var-dir", type=Path, default=None,
                        help="where Redis data, images and the saved URL and key go (default: $STEPWISE_VAR_DIR or ./var)")
    parser.add_argument("--startup-timeout", type=float, default=300.0,
                        help="seconds to wait for the worker to load its model and the API to answer (default 300)")


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    reader: threading.Thread
    stop_timeout: float  # seconds between SIGTERM and SIGKILL


class Supervisor:
    """Starts children, prefixes their output, notices deaths, stops them in reverse order."""

    def __init__(self) -> None:
        self.children: list[Child] = []
        self.stop_requested = threading.Event()
        self.kill_requested = threading.Event()
        self._output_lock = threading.Lock()

    def on_signal(self, signum: int, frame: object) -> None:
        if self.stop_requested.is_set():
            self.kill_requested.set()
        self.stop_requested.set()

    def start(self, name: str, argv: list[str], env: dict[str, str], stop_timeout: float = 15.0) -> Child:
        process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        reader = threading.Thread(target=self._relay, args=(name, process.stdout), name=f"log-{name}", daemon=True)
        reader.start()
        child = Child(name, process, reader, stop_timeout)
        self.children.append(child)
        self.say(f"started {name} (pid {process.pid})")
        return child

    def say(self, message: str) -> None:
        self._write(f"[up] {message}\n")

    def exited_child(self) -> Child | None:
        return next((child for child in self.children if child.process.poll() is not None), None)

    def sleep(self, seconds: float) -> None:
        """Sleep, unless a stop was requested or a child died meanwhile."""
        if self.stop_requested.wait(seconds):
            raise StopRequested
        child = self.exited_child()
        if child is not None:
            raise ServiceError(f"{child.name} exited with status {child.process.returncode}")

    def stop_all(self) -> None:
        for child in reversed(self.children):
            self._stop(child)
        self.children.clear()

    def _stop(self, child: Child) -> None:
        if child.process.poll() is None:
            self.say(f"stopping {child.name}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.process.pid, signal.SIGTERM)  # the leader shuts its own workers down gracefully
            deadline = time.monotonic() + child.stop_timeout
            while child.process.poll() is None and time.monotonic() < deadline and not self.kill_requested.is_set():
                time.sleep(0.1)
            if child.process.poll() is None:
                self.say(f"{child.name} did not stop in time: killing it")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signal.SIGKILL)  # whatever is left of its process group
        child.process.wait()
        child.reader.join(timeout=2)

    def _relay(self, name: str, stream) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip()
            if "\r" in text:  # a progress bar redrawn in place: keep its last state
                text = next((part for part in reversed(text.split("\r")) if part.strip()), "")
            self._write(f"[{name}] {text}\n")
        stream.close()

    def _write(self, text: str) -> None:
        with self._output_lock:
            sys.stdout.write(text)
            sys.stdout.flush()


_PR_SET_PDEATHSIG = 1
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if `stepwise up` itself is killed (Linux only)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def child_environment(args: argparse.Namespace, var_dir: Path, api_key: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("STEPWISE_STORAGE_URL", (var_dir / "images").as_uri())
    if not env.get("STEPWISE_API_KEYS"):
        env["STEPWISE_API_KEYS"] = f"{LOCAL_TENANT}:{api_key}"
    env.setdefault("STEPWISE_WEBHOOK_SECRET", new_webhook_secret())
    env.setdefault("STEPWISE_WORKER_METRICS_PORT", str(free_port()))
    for option, name in (("model", "STEPWISE_MODEL"), ("device", "STEPWISE_DEVICE"),
                         ("max_num_seqs", "STEPWISE_MAX_NUM_SEQS")):
        if getattr(args, option) is not None:
            env[name] = str(getattr(args, option))
    env.setdefault("STEPWISE_DEVICE", "cpu")
    return env


def choose_api_key(var_dir: Path) -> str:
    """The first key of STEPWISE_API_KEYS, else the one saved by an earlier run, else a new one."""
    configured = os.environ.get("STEPWISE_API_KEYS", "").strip()
    if configured:
        return configured.split(",")[0].partition(":")[2].strip()
    saved = load_local_target(var_dir)
    if saved and saved.key:
        return saved.key
    return f"sk_{secrets.token_urlsafe(24)}"


def wait_for_redis(supervisor: Supervisor, url: str, timeout: float) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return
            except (redis.ConnectionError, redis.BusyLoadingError) as e:
                if time.monotonic() > deadline:
                    raise ServiceError(f"Redis at {url} did not answer within {timeout:.0f}s: {e}") from e
            supervisor.sleep(0.1)
    finally:
        client.close()


def wait_for_api(supervisor: Supervisor, api_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{api_url}/readyz", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise ServiceError(f"the API at {api_url} was not ready within {timeout:.0f}s")
        supervisor.sleep(0.25)


def wait_for_worker(supervisor: Supervisor, redis_url: str, worker_name: str, timeout: float) -> None:
    """The worker answers a Celery ping once its consumer runs, which is after its model loaded."""
    from celery import Celery

    app = Celery("stepwise-up", broker=redis_url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            with contextlib.suppress(Exception):
                if app.control.ping(destination=[worker_name], timeout=1.0):
                    return
            if time.monotonic() > deadline:
                raise ServiceError(f"the worker did not come up within {timeout:.0f}s")
            supervisor.sleep(0.5)
    finally:
        app.close()


def preflight_error(args: argparse.Namespace, redis_url: str | None, redis_binary: str | None) -> str | None:
    """Why `stepwise up` cannot start, found before any child is started."""
    if not redis_url and not redis_binary:
        return REDIS_MISSING
    if not port_is_free(args.host, args.port):
        return f"stepwise up: port {args.port} on {args.host} is in use; choose another with --port\n"
    if args.redis_port and not redis_url and not port_is_free("127.0.0.1", args.redis_port):
        return f"stepwise up: port {args.redis_port} is in use; choose another --redis-port\n"
    try:
        float(os.environ.get("STEPWISE_SHUTDOWN_GRACE") or 30)
    except ValueError:
        return "stepwise up: STEPWISE_SHUTDOWN_GRACE must be a number of seconds\n"
    return None


def run(args: argparse.Namespace) -> int:
    var_dir = (args.var_dir or default_var_dir()).resolve()
    redis_url = os.environ.get("STEPWISE_REDIS_URL")
    redis_binary = shutil.which("redis-server")
    error = preflight_error(args, redis_url, redis_binary)
    if error:
        sys.stderr.write(error)
        return 1
    var_dir.mkdir(parents=True, exist_ok=True)
    api_key = choose_api_key(var_dir)
    env = child_environment(args, var_dir, api_key)
    api_url = f"http://{connect_host(args.host)}:{args.port}"
    started = time.monotonic()

    supervisor = Supervisor()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, supervisor.on_signal)
    try:
        if not redis_url:
            redis_url = start_redis(supervisor, redis_binary, args.redis_port or free_port(), var_dir / "redis", env)
        env["STEPWISE_REDIS_URL"] = redis_url
        wait_for_redis(supervisor, redis_url, timeout=30)
        worker_name = start_worker_and_api(supervisor, args, env)
        wait_for_api(supervisor, api_url, args.startup_timeout)
        wait_for_worker(supervisor, redis_url, worker_name, args.startup_timeout)

        state_file = save_local_target(var_dir, ApiTarget(api_url, api_key), redis_url=redis_url)
        print_banner(supervisor, api_url, api_key, state_file, env, redis_url, time.monotonic() - started,
                     custom_var_dir=args.var_dir is not None)
        while True:
            supervisor.sleep(0.5)
    except StopRequested:
        supervisor.say("stopping (Ctrl-C again to kill at once)")
        return 0
    except ServiceError as e:
        supervisor.say(f"error: {e}; stopping everything")
        return 1
    finally:
        supervisor.stop_all()
        supervisor.say("stopped")


def start_redis(supervisor: Supervisor, binary: str, port: int, data_dir: Path, env: dict[str, str]) -> str:
    data_dir.mkdir(exist_ok=True)
    supervisor.start("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
                               "--appendonly", "yes", "--daemonize", "no"], env)
    return f"redis://127.0.0.1:{port}/0"


def start_worker_and_api(supervisor: Supervisor, args: argparse.Namespace, env: dict[str, str]) -> str:
    """Start both (the worker loads its model meanwhile); returns the worker's Celery node name."""
    stepwise = [sys.executable, "-m", "stepwise_cli.main"]
    worker_name = f"up{os.getpid()}@{socket.gethostname()}"
    grace = float(env.get("STEPWISE_SHUTDOWN_GRACE") or 30)  # the worker's warm shutdown, plus a margin
    supervisor.start("worker", [*stepwise, "worker", "--hostname", worker_name], env, stop_timeout=grace + 15)
    start_webhook_worker(supervisor, stepwise, env)
    supervisor.start("api", [*stepwise, "api", "--host", args.host, "--port", str(args.port),
                             "--workers", str(args.api_workers)], env)
    return worker_name


def start_webhook_worker(supervisor: Supervisor, stepwise: list[str], env: dict[str, str]) -> None:
    """Webhook delivery in a process of its own (no model), so a slow receiver cannot hold the
    generating worker's threads (worker.webhooks)."""
    supervisor.start("webhooks", [*stepwise, "worker", "--queues", "stepwise.webhooks", "--concurrency", "4",
                                  "--hostname", f"up{os.getpid()}-webhooks@{socket.gethostname()}"],
                     {**env, "STEPWISE_WORKER_METRICS_PORT": "0"})


def print_banner(supervisor: Supervisor, api_url: str, api_key: str, state_file: Path, env: dict[str, str],
                 redis_url: str, elapsed: float, *, custom_var_dir: bool) -> None:
    var_option = f" --var-dir {state_file.parent}" if custom_var_dir else ""
    metrics_port = env.get("STEPWISE_WORKER_METRICS_PORT", "0")
    worker_metrics = f", worker http://127.0.0.1:{metrics_port}/metrics" if metrics_port != "0" else ""
    supervisor.say(
        f"stepwise is up after {elapsed:.1f}s\n\n"
        f"    API:      {api_url}    (spec: {api_url}/openapi.json)\n"
        f"    API key:  {api_key}    (saved in {state_file})\n"
        f"    images:   {env['STEPWISE_STORAGE_URL']}\n"
        f"    redis:    {redis_url}\n"
        f"    metrics:  {api_url}/metrics{worker_metrics}\n\n"
        f"  try:\n"
        f"    stepwise submit \"a red fox\" --wait --out out/{var_option}\n"
        f"    curl -H 'Authorization: Bearer {api_key}' -H 'Content-Type: application/json' \\\n"
        f"         -d '{{\"prompt\": \"a red fox\"}}' {api_url}/v1/jobs\n"
        f"    STEPWISE_REDIS_URL={redis_url} celery -A worker inspect engine_stats\n\n"
        f"  Ctrl-C stops everything."
    )
