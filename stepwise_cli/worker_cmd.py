"""`stepwise worker`: the GPU worker, i.e. `celery -A worker worker` with the right flags.

Options override the matching `STEPWISE_*` variables; everything else (Redis, storage,
leases, webhooks) comes from the environment, as for `celery -A worker worker`.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from storage.queue_names import GENERATE_QUEUE_ALIAS, WEBHOOK_QUEUE

OPTION_ENV = {
    "model": "STEPWISE_MODEL",
    "device": "STEPWISE_DEVICE",
    "max_num_seqs": "STEPWISE_MAX_NUM_SEQS",
    "policy": "STEPWISE_POLICY",
    "concurrency": "STEPWISE_WORKER_CONCURRENCY",
    "metrics_port": "STEPWISE_WORKER_METRICS_PORT",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model to serve (default: $STEPWISE_MODEL or builtin:tiny)")
    parser.add_argument("--device", help="auto, cpu, cuda, cuda:N (default: $STEPWISE_DEVICE or auto)")
    parser.add_argument("--max-num-seqs", type=int, help="jobs batched at once (default: $STEPWISE_MAX_NUM_SEQS or 8)")
    parser.add_argument("--policy", choices=("default", "fifo"), help="engine admission policy (default: default)")
    parser.add_argument(
        "--concurrency",
        type=int,
        help="task threads (default: max-num-seqs plus a few waiting, $STEPWISE_WORKER_CONCURRENCY)",
    )
    parser.add_argument(
        "--metrics-port", type=int, help="Prometheus port, 0 for none (default: $STEPWISE_WORKER_METRICS_PORT or 9101)"
    )
    parser.add_argument(
        "--queues",
        default=GENERATE_QUEUE_ALIAS,
        help="queues to consume (default: %(default)s, which means the served model's own queue). "
        f"Webhooks are delivered by a worker of their own, `--queues {WEBHOOK_QUEUE}`, which "
        "loads no model, so a slow receiver never holds a thread generation needs",
    )
    parser.add_argument("--hostname", "-n", help="Celery node name (default: celery@<host>)")
    parser.add_argument("--loglevel", "-l", default="INFO", help="log level (default: %(default)s)")


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


def run(args: argparse.Namespace) -> int:
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
        print(
            "stepwise worker: running as root (fine on a development machine; the docker images do not)",
            file=sys.stderr,
        )
    return app.start(celery_argv(args, settings.concurrency)) or 0
