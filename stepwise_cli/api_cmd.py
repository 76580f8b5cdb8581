"""`stepwise api`: serve the HTTP API, one app per worker process.

The server is granian (Rust HTTP, one process per core) serving the WSGI app through
`stepwise_cli.api_rsgi`, which reads each request body on granian's event loop before the app
runs on a thread: slow clients cost a buffer, never a thread, and head and body have read
deadlines; requests that wait on a job wait there too, as coroutines. Chosen over gunicorn (gevent)
by the waiting- and slow-client benchmarks (docs/api.md#the-server).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile

from settings import read

# No query string, referer or Basic-auth user: clients put keys there by mistake.
GRANIAN_ACCESS_FORMAT = '%(addr)s [%(time)s] "%(method)s %(path)s %(protocol)s" %(status)d %(dt_ms).1fms'


def default_workers() -> int:
    """A Rust event loop per process: one process per usable core, 2 to 8."""
    return min(max(len(os.sched_getaffinity(0)), 2), 8)


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
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: one per usable CPU, 2 to 8)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=read("STEPWISE_API_THREADS"),
        help="app threads per worker process (default: $STEPWISE_API_THREADS or 4)",
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
    args.workers = args.workers or default_workers()
    metrics_dir = prepare_metrics_dir()  # before anything imports prometheus_client

    from api.settings import ApiSettings, SettingsError

    try:
        settings = ApiSettings.from_env()  # fail here, once, rather than in every worker
    except (SettingsError, ValueError) as e:
        print(f"stepwise api: {e}", file=sys.stderr, flush=True)
        return 2
    tenants = sorted({tenant for tenant, _ in settings.api_keys})
    shape = f"granian, {args.workers} workers x {args.threads} threads"
    print(f"stepwise api: http://{args.host}:{args.port} ({shape}), tenants: {', '.join(tenants)}", file=sys.stderr)
    try:
        serve(args)
    finally:
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def serve(args: argparse.Namespace) -> None:
    from granian.constants import Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.server import Server

    header_timeout = read("STEPWISE_API_HEADER_TIMEOUT")
    os.environ["STEPWISE_API_THREADS"] = str(args.threads)  # read by stepwise_cli.api_rsgi in each worker
    server = Server(
        "stepwise_cli.api_rsgi:app",
        address=args.host,
        port=args.port,
        interface=Interfaces.RSGI,
        loop=Loops.asyncio,  # stepwise_cli.api_rsgi hears SIGTERM beside granian through asyncio's wakeup fd
        workers=args.workers,
        backpressure=read("STEPWISE_API_MAX_CONNECTIONS"),
        http1_settings=HTTP1Settings(header_read_timeout=max(1, round(header_timeout * 1000))),
        log_access=args.access_log,
        log_access_format=GRANIAN_ACCESS_FORMAT,
        respawn_failed_workers=True,
        # a worker still up a second after its drain (stepwise_cli.api_rsgi) is killed: the exit stays bounded
        workers_kill_timeout=math.ceil(read("STEPWISE_API_DRAIN_SECONDS")) + 1,
    )
    try:
        server.serve()
    except SystemExit as e:
        # A stop sent to the process group (a terminal's Ctrl-C, `stepwise up`, `kill -- -PGID`) reaches every
        # worker at once: a worker with nothing in flight drains in milliseconds and can exit before granian's
        # main process has marked its workers as stopped by it, which granian counts as a worker failure (exit 1).
        # After a SIGTERM or SIGINT this process heard itself, the stop is the one asked for.
        if e.code == 1 and server.interrupt_signal:
            print("stepwise api: stopped on signal (a worker drained before granian asked it to)", file=sys.stderr)
            return
        raise
