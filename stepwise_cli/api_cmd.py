"""`stepwise api`: serve the HTTP API, one app per worker process.

The default server is granian (Rust HTTP, one process per core) serving the WSGI app through
`stepwise_cli.api_rsgi`, which reads each request body on granian's event loop before the app
runs on a thread: slow clients cost a buffer, never a thread, and head and body have read
deadlines (docs/api.md; docs/scaling.md has the slow-client measurement). It
takes more submits per second than gunicorn on 2 cores (docs/api.md#throughput).

`--server gunicorn` runs gunicorn with gevent workers (`stepwise_cli.api_worker`, the same
deadlines and a connection limit, and JSON bodies for the requests gunicorn refuses itself);
`--worker-class gthread` remains for comparison.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from typing import Any

from settings import declared, default, read

SERVERS = declared("STEPWISE_API_SERVER").kind.options  # type: ignore[attr-defined]  # a Choice
DEFAULT_SERVER = default("STEPWISE_API_SERVER")
# No query string, referer or Basic-auth user: clients put keys there by mistake.
GUNICORN_ACCESS_FORMAT = '%(h)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms "%(a)s"'
GRANIAN_ACCESS_FORMAT = '%(addr)s [%(time)s] "%(method)s %(path)s %(protocol)s" %(status)d %(dt_ms).1fms'


def default_workers(server: str = DEFAULT_SERVER) -> int:
    if server == "granian":  # a Rust event loop per process: one process per usable core, 2 to 8
        return min(max(len(os.sched_getaffinity(0)), 2), 8)
    return min(2 * (os.cpu_count() or 1) + 1, 8)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default=read("STEPWISE_API_HOST"),
        help="address to listen on (default: $STEPWISE_API_HOST or 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=read("STEPWISE_API_PORT"),
        help="port (default: $STEPWISE_API_PORT or 8000)",
    )
    parser.add_argument(
        "--server",
        default=read("STEPWISE_API_SERVER"),
        help="granian or gunicorn (default: $STEPWISE_API_SERVER or granian)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: granian one per usable CPU, 2 to 8; gunicorn 2 x CPUs + 1, at most 8)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=read("STEPWISE_API_THREADS"),
        help="app threads per granian process or gunicorn gthread worker (default: $STEPWISE_API_THREADS or 4)",
    )
    parser.add_argument(
        "--worker-class",
        choices=("gevent", "gthread"),
        default="gevent",
        help="with --server gunicorn: worker class (default: gevent, which slow clients cannot starve)",
    )
    parser.add_argument("--access-log", action="store_true", help="log every request to stderr")


def prepare_metrics_dir() -> str | None:
    """Several workers share request metrics through files; returns a folder to remove at exit."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    folder = tempfile.mkdtemp(prefix="stepwise-api-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    return folder


def run(args: argparse.Namespace) -> int:
    if args.server not in SERVERS:
        print(
            f"stepwise api: STEPWISE_API_SERVER must be one of {', '.join(SERVERS)} (got {args.server!r})",
            file=sys.stderr,
        )
        return 2
    is_gevent = args.server == "gunicorn" and args.worker_class == "gevent"
    if is_gevent:
        # Before anything imports ssl or socket users (gunicorn, redis, boto3): patched late,
        # gevent warns that ssl may misbehave. The workers fork from this process.
        from gevent import monkey

        monkey.patch_all()
    args.workers = args.workers or default_workers(args.server)
    metrics_dir = prepare_metrics_dir()  # before anything imports prometheus_client

    from api.settings import ApiSettings, SettingsError

    try:
        settings = ApiSettings.from_env()  # fail here, once, rather than in every worker
    except (SettingsError, ValueError) as e:
        print(f"stepwise api: {e}", file=sys.stderr, flush=True)
        if is_gevent:  # a normal exit would print gevent's finalizer noise after the one line
            os._exit(2)
        return 2
    max_connections = read("STEPWISE_API_MAX_CONNECTIONS")
    tenants = sorted({tenant for tenant, _ in settings.api_keys})
    if args.server == "granian":
        shape = f"granian, {args.workers} workers x {args.threads} threads"
    else:
        each = f"{max_connections} connections" if is_gevent else f"{args.threads} threads"
        shape = f"{args.workers} {args.worker_class} workers x {each}"
    print(f"stepwise api: http://{args.host}:{args.port} ({shape}), tenants: {', '.join(tenants)}", file=sys.stderr)
    try:
        if args.server == "granian":
            serve_granian(args, max_connections=max_connections)
        else:
            serve_gunicorn(args, is_gevent=is_gevent, max_connections=max_connections)
    finally:
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def serve_granian(args: argparse.Namespace, *, max_connections: int) -> None:
    from granian.constants import Interfaces
    from granian.http import HTTP1Settings
    from granian.server import Server

    header_timeout = read("STEPWISE_API_HEADER_TIMEOUT")
    os.environ["STEPWISE_API_THREADS"] = str(args.threads)  # read by stepwise_cli.api_rsgi in each worker
    Server(
        "stepwise_cli.api_rsgi:app",
        address=args.host,
        port=args.port,
        interface=Interfaces.RSGI,
        workers=args.workers,
        backpressure=max_connections,
        http1_settings=HTTP1Settings(header_read_timeout=max(1, round(header_timeout * 1000))),
        log_access=args.access_log,
        log_access_format=GRANIAN_ACCESS_FORMAT,
        respawn_failed_workers=True,
    ).serve()


def serve_gunicorn(args: argparse.Namespace, *, is_gevent: bool, max_connections: int) -> None:
    from gunicorn.app.base import BaseApplication

    from stepwise_cli.api_worker import ApiWorker

    header_timeout = math.ceil(read("STEPWISE_API_HEADER_TIMEOUT"))  # whole seconds: gunicorn keepalive is an int
    ApiWorker.request_timeout = read("STEPWISE_API_REQUEST_TIMEOUT")  # inherited by forked workers

    def child_exit(server: Any, worker: Any) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)

    class ApiServer(BaseApplication):
        def load_config(self) -> None:
            options = {
                "bind": f"{args.host}:{args.port}",
                "workers": args.workers,
                "threads": args.threads,
                "worker_class": "stepwise_cli.api_worker.ApiWorker" if is_gevent else "gthread",
                "worker_connections": max_connections,
                # gevent: the whole request head must arrive within this (also the keep-alive idle time)
                "keepalive": header_timeout if is_gevent else 2,
                "accesslog": "-" if args.access_log else None,
                "access_log_format": GUNICORN_ACCESS_FORMAT,
                "errorlog": "-",
                "child_exit": child_exit,
                "proc_name": "stepwise-api",
                "limit_request_line": 8190,  # gunicorn's maximum: long listing cursors and image URLs fit
            }
            for name, value in options.items():
                self.cfg.set(name, value)

        def load(self) -> Any:
            from api import create_app

            return create_app()

    ApiServer().run()
