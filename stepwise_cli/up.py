"""`stepwise up`: the whole service on one machine, with embedded defaults.

Children (see `stepwise_cli.supervisor`): redis-server (unless STEPWISE_REDIS_URL names one;
append-only data under `<var>/redis`), `stepwise worker` and `stepwise api`. Their
configuration travels in `STEPWISE_*` variables.

Ctrl-C or SIGTERM stops the children in reverse order (api, worker with a warm shutdown,
redis), each with SIGTERM and then SIGKILL after a timeout; a second Ctrl-C kills at once.
A child that exits on its own, even with status 0, is restarted with a backoff (its jobs come back
through the dead worker's heartbeat, `worker.dead_workers`); one that fails again and again right
after starting stops everything with exit status 1, and `up` says what happened (status or signal,
the child's last line, and that it gave up).

The embedded Redis and the worker's metrics endpoint keep their ports from one `up` to the next
(saved in `<var>/stepwise.json` with the API's URL and key), so a shell that exported
STEPWISE_REDIS_URL, or a Prometheus that scrapes the worker, keeps working after a restart. The file
also holds the shared settings up gave its children (Redis, storage, LoRA store, webhook secret ...:
the "shared" section of settings.table), so that `stepwise worker` started from the same folder
joins this service (stepwise_cli.worker_cmd).

Secrets: `up` prints an API key only when it generated that key itself, and shows every URL
with its password masked (the saved state file, readable by the owner only, keeps them whole).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import redis
import requests

from core.params import SHOWCASE_MODEL
from core.shapes_vocabulary import ShapePrompt
from settings import SettingsError, read, read_if_set
from stepwise_cli.client import STATE_FILE_NAME, ApiTarget, default_var_dir, load_local_target, save_local_target
from stepwise_cli.folder_lock import FolderInUse, hold_folder
from stepwise_cli.supervisor import ServiceError, StopRequested, Supervisor, mask_password
from storage.queue_names import WEBHOOK_QUEUE
from storage.redis_clients import celery_redis_config, close_redis, open_redis
from storage.redis_location import with_sentinel_master

LOCAL_TENANT = "local"
REDIS_MISSING = """\
stepwise up: redis-server is not installed, and STEPWISE_REDIS_URL does not name a running Redis.
Install it with one of:
    sudo apt-get install redis-server        # Debian, Ubuntu
    brew install redis                       # macOS
    sudo dnf install redis                   # Fedora
or run `make run`, which installs it when it can; or set STEPWISE_REDIS_URL=redis://HOST:PORT/0.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="API address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=read("STEPWISE_API_PORT"), help="API port (default: $STEPWISE_API_PORT or 8000)"
    )
    parser.add_argument(
        "--model",
        help=f"model the worker serves and jobs get by default (default: $STEPWISE_MODEL, else {SHOWCASE_MODEL})",
    )
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: $STEPWISE_DEVICE, else cpu)")
    parser.add_argument("--max-num-seqs", type=int, help="jobs the worker batches at once (default: the worker's)")
    parser.add_argument(
        "--api-workers",
        type=int,
        default=2,
        help="API worker processes (default 2: the model needs the CPU more)",
    )
    parser.add_argument("--redis-port", type=int, help="port for the embedded redis-server (default: a free one)")
    parser.add_argument(
        "--var-dir",
        type=Path,
        default=None,
        help="where Redis data, images and the saved URL and key go (default: $STEPWISE_VAR_DIR or ./var)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for the worker to load its model and the API to answer (default 300)",
    )


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
    env.setdefault("STEPWISE_SPOOL_DIR", str(var_dir / "spool"))  # a restarted worker finds what it left there
    if not env.get("STEPWISE_API_KEYS"):
        env["STEPWISE_API_KEYS"] = f"{LOCAL_TENANT}:{api_key}"
        # One person's machine: the generated key is also the operator's (/metrics, /v1/admin).
        env.setdefault("STEPWISE_ADMIN_API_KEYS", f"{LOCAL_TENANT}:{api_key}")
    env.setdefault("STEPWISE_WEBHOOK_SECRET", new_webhook_secret())
    env.setdefault("STEPWISE_WORKER_METRICS_PORT", str(kept_port(None, var_dir, "worker_metrics_port")[0]))
    for option, name in (
        ("model", "STEPWISE_MODEL"),
        ("device", "STEPWISE_DEVICE"),
        ("max_num_seqs", "STEPWISE_MAX_NUM_SEQS"),
    ):
        if getattr(args, option) is not None:
            env[name] = str(getattr(args, option))
    env.setdefault("STEPWISE_DEVICE", "cpu")
    env["STEPWISE_MODEL"] = args.model or read("STEPWISE_MODEL", SHOWCASE_MODEL)  # the worker's, the API's default
    # The API serves it by configuration: jobs are accepted while the worker still loads the model.
    env["STEPWISE_MODELS"] = env.get("STEPWISE_MODELS") or env["STEPWISE_MODEL"]
    return env


@dataclass(frozen=True)
class ApiKeyChoice:
    key: str
    is_generated: bool  # by `up` (now or in an earlier run): safe to print; a configured key is not


def choose_api_key(var_dir: Path) -> ApiKeyChoice:
    """The first key of STEPWISE_API_KEYS, else the one `up` saved in an earlier run, else a new one."""
    configured = (read("STEPWISE_API_KEYS") or "").strip()
    if configured:
        return ApiKeyChoice(configured.split(",")[0].partition(":")[2].strip(), is_generated=False)
    saved = load_local_target(var_dir)
    if saved and saved.key:
        return ApiKeyChoice(saved.key, is_generated=True)
    return ApiKeyChoice(f"sk_{secrets.token_urlsafe(24)}", is_generated=True)


def embedded_redis_port(requested: int | None, var_dir: Path) -> tuple[int, str | None]:
    """The port of the embedded redis-server: --redis-port, else the one an earlier `up` saved (if it is free
    now), else a free one. Returns it with a note to print when the saved port could not be kept."""
    return kept_port(requested, var_dir, "redis_port", "the embedded Redis's port")


def kept_port(requested: int | None, var_dir: Path, key: str, what: str = "a port") -> tuple[int, str | None]:
    """`requested`, else the port an earlier `up` saved under `key` (if it is free now), else a free one; with a
    note to print when the saved port could not be kept."""
    if requested:
        return requested, None
    saved = saved_port(var_dir, key)
    if saved is None:
        return free_port(), None
    if port_is_free("127.0.0.1", saved):
        return saved, None
    port = free_port()
    return port, f"{what} {saved} (saved in {var_dir / STATE_FILE_NAME}) is in use: using {port}"


def saved_port(var_dir: Path, key: str) -> int | None:
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        port = int(json.loads((var_dir / STATE_FILE_NAME).read_text())[key])
        return port if 0 < port < 65536 else None
    return None


def suggested_prompt(model: str) -> str:
    """A prompt the served model draws: the shapes models' grammar, else any prompt (random-weight
    built-ins draw noise-like patterns whatever they are asked)."""
    if model.startswith(f"{SHOWCASE_MODEL}"):
        return ShapePrompt("red", "circle", "blue").text
    return "a red fox in the snow"


def settings_error(env: dict[str, str]) -> str | None:
    """Check the settings the children will read, in this process, before starting any of them.

    The worker checks its own settings again when it starts (and `up` reports its one-line error).
    """
    from api.settings import ApiSettings

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        ApiSettings.from_env()
    except ValueError as e:
        return f"stepwise up: {e}\n"
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return None


def wait_for_redis(supervisor: Supervisor, url: str, timeout: float) -> None:
    client = open_redis(url, socket_connect_timeout=1)  # a Sentinel URL's master too (storage.redis_clients)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return
            except (redis.ConnectionError, redis.BusyLoadingError) as e:
                if time.monotonic() > deadline:
                    raise ServiceError(
                        f"Redis at {mask_password(url)} did not answer within {timeout:.0f}s: {e}"
                    ) from e
            supervisor.sleep(0.1)
    finally:
        close_redis(client)


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

    app = Celery("stepwise-up", set_as_current=False)
    app.conf.update(celery_redis_config(redis_url, broker_transport_options={}))
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
        other = args.port + 1
        return (
            f"stepwise up: port {args.port} on {args.host} is in use; choose another: `stepwise up --port {other}`, "
            f"`make run PORT={other}`, or STEPWISE_API_PORT={other}\n"
        )
    if args.redis_port and not redis_url and not port_is_free("127.0.0.1", args.redis_port):
        return f"stepwise up: port {args.redis_port} is in use; choose another --redis-port\n"
    try:
        read("STEPWISE_SHUTDOWN_GRACE")
        read("STEPWISE_DRAIN_SECONDS")
    except SettingsError as e:
        return f"stepwise up: {e}\n"
    return None


def run(args: argparse.Namespace) -> int:
    var_dir = (args.var_dir or default_var_dir()).resolve()
    api_url = f"http://{connect_host(args.host)}:{args.port}"
    var_dir.mkdir(parents=True, exist_ok=True)
    try:  # first of all: a second `up` here is refused before it touches anything (stepwise_cli.folder_lock)
        lock_fd = hold_folder(var_dir, api_url)
    except FolderInUse as e:
        sys.stderr.write(f"stepwise up: {e}\n")
        return 1
    try:
        return run_holding_folder(args, var_dir, api_url)
    finally:
        os.close(lock_fd)


def run_holding_folder(args: argparse.Namespace, var_dir: Path, api_url: str) -> int:
    """Everything `up` does once it holds its folder: check, start the children, report, supervise, stop."""
    redis_url = read_if_set("STEPWISE_REDIS_URL")
    if redis_url:  # a Sentinel URL carries its master's name (saved so in the state file)
        redis_url = with_sentinel_master(redis_url, read_if_set("STEPWISE_REDIS_SENTINEL_MASTER"))
    redis_binary = shutil.which("redis-server")
    error = preflight_error(args, redis_url, redis_binary)
    if error:
        sys.stderr.write(error)
        return 1
    api_key = choose_api_key(var_dir)
    env = child_environment(args, var_dir, api_key.key)
    error = settings_error(env)
    if error:
        sys.stderr.write(error)
        return 2
    env.setdefault("STEPWISE_PUBLIC_URL", api_url)  # the worker's webhook payloads link to this API
    started = time.monotonic()

    supervisor = Supervisor()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, supervisor.on_signal)
    redis_port = None
    try:
        if not redis_url:
            redis_port, note = embedded_redis_port(args.redis_port, var_dir)
            if note:
                supervisor.say(note)
            assert redis_binary is not None  # preflight_error refused a missing redis-server
            redis_url = start_redis(supervisor, redis_binary, redis_port, var_dir / "redis", env)
        env["STEPWISE_REDIS_URL"] = redis_url
        wait_for_redis(supervisor, redis_url, timeout=30)
        worker_name = start_worker_and_api(supervisor, args, env)
        wait_for_api(supervisor, api_url, args.startup_timeout)
        wait_for_worker(supervisor, redis_url, worker_name, args.startup_timeout)

        kept = {"redis_port": redis_port} if redis_port else {}
        # The pid tells other processes this `up` still runs, so its Redis is the one to use (storage.redis_location).
        state_file = save_local_target(
            var_dir,
            ApiTarget(api_url, api_key.key),
            redis_url=redis_url,
            pid=os.getpid(),
            worker_metrics_port=int(env["STEPWISE_WORKER_METRICS_PORT"]),
            service_env=service_env(env),
            **kept,
        )
        supervisor.say(
            banner(
                api_url,
                api_key,
                state_file,
                env,
                redis_url,
                time.monotonic() - started,
                custom_var_dir=args.var_dir is not None,
                keeps_redis_port=redis_port is not None,
            )
        )
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


def service_env(env: dict[str, str]) -> dict[str, str]:
    """The shared settings (settings.table's "shared" section) up gave its children: what a `stepwise worker`
    started beside it needs to join this service, saved in the state file."""
    from settings.table import VARIABLES

    return {v.name: env[v.name] for v in VARIABLES if v.section == "shared" and env.get(v.name)}


def start_redis(supervisor: Supervisor, binary: str, port: int, data_dir: Path, env: dict[str, str]) -> str:
    data_dir.mkdir(exist_ok=True)
    supervisor.start(
        "redis",
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data_dir),
            "--appendonly",
            "yes",
            "--daemonize",
            "no",
        ],
        env,
    )
    return f"redis://127.0.0.1:{port}/0"


def start_worker_and_api(supervisor: Supervisor, args: argparse.Namespace, env: dict[str, str]) -> str:
    """Start both (the worker loads its model meanwhile); returns the worker's Celery node name."""
    stepwise = [sys.executable, "-m", "stepwise_cli.main"]
    worker_name = f"up{os.getpid()}@{socket.gethostname()}"
    drain = read("STEPWISE_DRAIN_SECONDS")  # the worker's drain at SIGTERM (worker.drain), plus a margin
    supervisor.start(
        "worker", [*stepwise, "worker", "--quiet", "--hostname", worker_name], env, stop_timeout=drain + 15
    )
    start_webhook_worker(supervisor, stepwise, env)
    supervisor.start(
        "api",
        [*stepwise, "api", "--host", args.host, "--port", str(args.port), "--workers", str(args.api_workers)],
        env,
    )
    return worker_name


def start_webhook_worker(supervisor: Supervisor, stepwise: list[str], env: dict[str, str]) -> None:
    """Webhook delivery in a process of its own (no model), so a slow receiver cannot hold the
    generating worker's threads (worker.webhooks)."""
    supervisor.start(
        "webhooks",
        [
            *stepwise,
            "worker",
            "--quiet",
            "--queues",
            WEBHOOK_QUEUE,
            "--concurrency",
            "4",
            "--hostname",
            f"up{os.getpid()}-webhooks@{socket.gethostname()}",
        ],
        {**env, "STEPWISE_WORKER_METRICS_PORT": "0"},
    )


def banner(
    api_url: str,
    api_key: ApiKeyChoice,
    state_file: Path,
    env: dict[str, str],
    redis_url: str,
    elapsed: float,
    *,
    custom_var_dir: bool,
    keeps_redis_port: bool = False,
) -> str:
    """What `up` prints once everything answers: where things are and commands to try, no configured secret.
    Every command in it works pasted into a shell (the key's variable in double quotes, so it expands)."""
    var_option = f" --var-dir {state_file.parent}" if custom_var_dir else ""
    metrics_port = env.get("STEPWISE_WORKER_METRICS_PORT", "0")
    worker_metrics = f", worker http://127.0.0.1:{metrics_port}/metrics" if metrics_port != "0" else ""
    if api_key.is_generated:
        key_line, bearer = f"{api_key.key}    (generated; saved in {state_file})", api_key.key
    else:
        key_line, bearer = "the first key of STEPWISE_API_KEYS (not shown)", "$STEPWISE_API_KEY"
    # Celery's tools find this Redis as every stepwise command does (storage.redis_location): from the
    # environment, else through the state file of this running `up`.
    var_prefix = f"STEPWISE_VAR_DIR={state_file.parent} " if custom_var_dir else ""
    inspect = f"{var_prefix}celery -A worker inspect engine_stats"
    redis_note = f"    (embedded; its port is kept in {state_file})" if keeps_redis_port else ""
    prompt = suggested_prompt(env["STEPWISE_MODEL"])
    body = json.dumps({"prompt": prompt})
    return (
        f"stepwise is up after {elapsed:.1f}s\n\n"
        f"    page:     {api_url}/    (paste the API key there once)\n"
        f"    API:      {api_url}    (spec: {api_url}/openapi.json)\n"
        f"    API key:  {key_line}\n"
        f"    model:    {env['STEPWISE_MODEL']} on {env['STEPWISE_DEVICE']}    (jobs that name no model get it)\n"
        f"    images:   {mask_password(env['STEPWISE_STORAGE_URL'])}\n"
        f"    redis:    {mask_password(redis_url)}{redis_note}\n"
        f"    metrics:  {api_url}/metrics (an admin key){worker_metrics}\n\n"
        f"  try:\n"
        f'    stepwise submit "{prompt}" --wait --out out/{var_option}\n'
        f'    curl -H "Authorization: Bearer {bearer}" -H "Content-Type: application/json" \\\n'
        f"         -d '{body}' {api_url}/v1/jobs\n"
        f"    {inspect}\n\n"
        f"  Ctrl-C stops everything."
    )
