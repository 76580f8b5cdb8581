"""`stepwise worker`: the GPU worker, i.e. `celery -A worker worker` with the right flags.

Options override the matching `STEPWISE_*` variables; everything else (Redis, storage,
leases, webhooks) comes from the environment, as for `celery -A worker worker`. Where the
environment names no Redis (STEPWISE_REDIS_URL unset) and a `stepwise up` runs from the same folder,
the worker joins that service: its Redis, found as every process finds it (storage.redis_location),
and the other shared settings `up` saved in `<var>/stepwise.json` (storage, LoRA store, webhook
secret ...; a variable that is set still wins), so `stepwise worker --model
builtin:tiny-qwen-image-edit` beside `stepwise up` needs nothing else.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from settings import read_if_set
from stepwise_cli.client import STATE_FILE_NAME, default_var_dir, load_service_env
from storage.queue_names import ENGINE_ROLE, WEBHOOK_QUEUE
from storage.redis_location import running_up_redis

OPTION_ENV = {
    "model": "STEPWISE_MODEL",
    "device": "STEPWISE_DEVICE",
    "max_num_seqs": "STEPWISE_MAX_NUM_SEQS",
    "policy": "STEPWISE_POLICY",
    "concurrency": "STEPWISE_WORKER_CONCURRENCY",
    "metrics_port": "STEPWISE_WORKER_METRICS_PORT",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{parser.description}. Started from the folder a `stepwise up` runs from, with no STEPWISE_REDIS_URL "
        f"set, it joins up's service with what up saved in var/{STATE_FILE_NAME}: Redis, image storage, "
        "LoRA store, webhook secret; a STEPWISE_* variable that is set wins. Elsewhere set at least "
        "STEPWISE_REDIS_URL and STEPWISE_STORAGE_URL (docs/operations.md)."
    )
    parser.add_argument("--model", help="model to serve (default: $STEPWISE_MODEL or builtin:tiny)")
    parser.add_argument("--device", help="auto, cpu, cuda, cuda:N (default: $STEPWISE_DEVICE or auto)")
    parser.add_argument("--max-num-seqs", type=int, help="jobs batched at once (default: $STEPWISE_MAX_NUM_SEQS or 8)")
    parser.add_argument("--policy", choices=("default", "fifo"), help="engine admission policy (default: default)")
    parser.add_argument(
        "--concurrency",
        type=int,
        help="jobs held at once (default: max-num-seqs plus a few waiting in the engine, "
        "$STEPWISE_WORKER_CONCURRENCY); in a webhook-only worker, deliveries at once",
    )
    parser.add_argument(
        "--metrics-port", type=int, help="Prometheus port, 0 for none (default: $STEPWISE_WORKER_METRICS_PORT or 9101)"
    )
    parser.add_argument(
        "--queues",
        default=ENGINE_ROLE,
        help="what the worker does (default: %(default)s: it loads the model and takes that model's jobs). "
        f"Webhooks are delivered by a worker of their own, `--queues {WEBHOOK_QUEUE}`, which "
        "loads no model, so a slow receiver never holds a thread generation needs",
    )
    parser.add_argument("--hostname", "-n", help="Celery node name (default: celery@<host>)")
    parser.add_argument("--loglevel", "-l", default="INFO", help="log level (default: %(default)s)")
    parser.add_argument(
        "--var-dir",
        type=Path,
        help=f"where `stepwise up` saved {STATE_FILE_NAME} (default: $STEPWISE_VAR_DIR or ./var)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no Celery banner and no note about running as root (`stepwise up`)"
    )


def celery_argv(args: argparse.Namespace, concurrency: int) -> list[str]:
    argv = [
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        str(concurrency),
        "--prefetch-multiplier",
        "1",
        "--task-events",
        "--queues",
        args.queues,
        "--loglevel",
        args.loglevel,
    ]
    if args.hostname:
        argv += ["--hostname", args.hostname]
    return argv


def join_local_service(var_dir: Path) -> None:
    """When the environment names no Redis and a `stepwise up` still runs from `var_dir`'s folder (the rule
    storage.redis_location finds its Redis by), take the other shared settings it saved for every variable the
    environment does not set, and say so."""
    if read_if_set("STEPWISE_REDIS_URL") or running_up_redis(var_dir / STATE_FILE_NAME) is None:
        return
    saved = load_service_env(var_dir)
    taken = [name for name in saved if name != "STEPWISE_REDIS_URL" and read_if_set(name) is None]
    for name in taken:
        os.environ[name] = saved[name]
    if taken:
        print(
            f"stepwise worker: joining the `stepwise up` that runs from here: {', '.join(taken)} from "
            f"{var_dir / STATE_FILE_NAME}",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    if args.var_dir is not None:
        os.environ["STEPWISE_VAR_DIR"] = str(args.var_dir)  # where storage.redis_location looks too
    join_local_service(default_var_dir())
    for option, name in OPTION_ENV.items():
        value = getattr(args, option)
        if value is not None:
            os.environ[name] = str(value)
    try:
        from worker import app  # reads and checks every setting
        from worker.app import settings
    except ValueError as e:  # a malformed STEPWISE_* variable, named in the message
        print(f"stepwise worker: {e}", file=sys.stderr)
        return 2
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Celery's multi-line "superuser privileges" warning, where a user cannot act on it (a root
        # shell running `stepwise up`): the images in docker/ run the worker as an unprivileged user.
        from celery.exceptions import SecurityWarning

        warnings.filterwarnings("ignore", category=SecurityWarning)
        if not args.quiet:
            print(
                "stepwise worker: running as root (fine on a development machine; the docker images do not)",
                file=sys.stderr,
            )
    quiet = ["--quiet"] if args.quiet else []  # Celery's global option: no banner
    return app.start([*quiet, *celery_argv(args, settings.concurrency)]) or 0
