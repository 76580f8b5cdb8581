"""The Celery app, configured so that `celery -A worker worker` is right for a GPU worker.

Jobs are not Celery tasks: an engine worker's feeder takes its model's jobs from their queue in Redis and runs
each on a thread of its own (`worker.feeder`). The worker is a Celery worker for Celery's tools (`celery -A
worker inspect ...`, `control ...`, `control revoke JOB_ID`: `worker.control`) and for webhook deliveries, the
one task it runs:

- threads pool: one process, so every job thread shares one engine and its jobs batch together (prefork would
  load the model per child; solo cannot answer `inspect` while it works);
- `-Q stepwise.generate` (`storage.queue_names.ENGINE_ROLE`; also what no `-Q` at all includes) makes it an
  engine worker; it consumes no Celery queue for that (`worker.lifecycle`). `-Q stepwise.webhooks` makes it
  deliver webhooks, on as many Celery threads as `STEPWISE_WORKER_CONCURRENCY`;
- prefetch multiplier 1 and late acknowledgement with rejection on worker loss: a delivery's message leaves
  Redis only after its attempt ended, and `STEPWISE_VISIBILITY_TIMEOUT` is how long Redis waits before it
  redelivers one whose worker died (`worker.webhooks`);
- task events on, for Flower;
- kombu's Redis transport (its Sentinel transport for a `sentinel://` URL, `storage.redis_clients`) with a fix
  that lets the consumer reconnect after Redis restarts or fails over (`worker.broker`);
- the Redis every stepwise process finds (`storage.redis_location`: STEPWISE_REDIS_URL, else a running
  `stepwise up`'s, else the default), which Celery's command line names on stderr
  (`celery -A worker inspect ping` says which Redis it asked, or in one line why it cannot tell).
"""

from __future__ import annotations

import sys

import click
from celery import Celery
from kombu import Exchange, Queue

from settings import SettingsError
from storage.queue_names import ENGINE_ROLE, WEBHOOK_QUEUE, WEBHOOK_TASK
from storage.redis_clients import celery_redis_config
from storage.redis_location import RedisLocation
from worker.broker import transport_for
from worker.settings import WorkerSettings


def is_celery_command_line() -> bool:
    """Loaded by Celery's own command line (`celery -A worker ...`, which imports this module while it reads -A)."""
    context = click.get_current_context(silent=True)
    return context is not None and context.command.name == "celery"


try:
    settings = WorkerSettings.from_env()
except SettingsError as e:
    if not is_celery_command_line():
        raise
    # Celery would print its "Unable to load celery application" and two tracebacks around the one line that
    # matters (a malformed variable, or the stopped `stepwise up` whose Redis this folder names: redis_location)
    print(f"stepwise: {e}", file=sys.stderr)
    raise SystemExit(2) from None

redis_config = celery_redis_config(
    settings.storage.redis_url,
    broker_transport_options={"visibility_timeout": settings.visibility_timeout},
    result_backend_transport_options={"visibility_timeout": settings.visibility_timeout},
)
app = Celery("stepwise", broker=redis_config.pop("broker_url"), backend=redis_config.pop("result_backend"))
app.conf.update(
    **redis_config,  # the transport options, and with Sentinel the master's name and TLS
    broker_transport=transport_for(settings.storage.redis_url),  # kombu's Redis transport, reconnecting after restarts
    worker_pool="threads",
    worker_concurrency=settings.concurrency,
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_send_task_events=True,
    task_send_sent_event=True,
    task_ignore_result=True,  # the job record is the result; nothing reads Celery's
    task_queues=(
        Queue(ENGINE_ROLE),  # selects the engine role at start, then deselected: nothing is sent to it
        Queue(WEBHOOK_QUEUE, Exchange(WEBHOOK_QUEUE), routing_key=WEBHOOK_QUEUE),
    ),
    task_default_queue=WEBHOOK_QUEUE,
    task_routes={WEBHOOK_TASK: {"queue": WEBHOOK_QUEUE}},
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
)


def say_which_redis(location: RedisLocation) -> None:
    """Under Celery's command line (`celery -A worker inspect ...`, which loads this module while it
    reads `-A`), name the Redis it will talk to, on stderr so `--json` output stays parseable."""
    if is_celery_command_line():
        print(f"stepwise: Redis {location.describe()}", file=sys.stderr)


say_which_redis(RedisLocation(settings.storage.redis_url, settings.storage.redis_source))
