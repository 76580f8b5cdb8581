"""The Celery app, configured so that `celery -A worker worker` is right for a GPU worker.

- threads pool: every task thread of the process shares one engine, so jobs batch together
  (prefork would load the model per child; solo runs one job at a time and cannot answer
  `inspect` while it runs);
- concurrency from `max_num_seqs`: the batch full plus a few jobs waiting in the engine;
- prefetch multiplier 1 and late acknowledgement with rejection on worker loss: a message
  leaves Redis only after its job reached an end, and a worker holds no more than it runs;
- a visibility timeout longer than the longest job, so Redis does not redeliver running work
  (a dead worker's jobs come back sooner through job leases, see `worker.leases`);
- one generate queue per model (`storage.queue_names`): this worker's task queues are its model's
  queue and the webhook queue; `-Q stepwise.generate` names its model's queue (`worker.lifecycle`);
- kombu priorities on the Redis lists (high, normal, low), normal for anything sent without one;
- task events on, for Flower;
- kombu's Redis transport (its Sentinel transport for a `sentinel://` URL, `storage.redis_clients`) with a fix
  that lets the consumer reconnect after Redis restarts or fails over (`worker.broker`);
- the Redis every stepwise process finds (`storage.redis_location`: STEPWISE_REDIS_URL, else a running
  `stepwise up`'s, else the default), which Celery's command line names on stderr
  (`celery -A worker inspect ping` says which Redis it asked).
"""

from __future__ import annotations

import sys

import click
from celery import Celery
from kombu import Exchange, Queue

from storage.queue_names import (
    BROKER_PRIORITY,
    DEFAULT_PRIORITY,
    WEBHOOK_QUEUE,
    WEBHOOK_TASK,
    celery_transport_options,
)
from storage.redis_clients import celery_redis_config
from storage.redis_location import RedisLocation
from worker.broker import transport_for
from worker.settings import WorkerSettings

settings = WorkerSettings.from_env()
generate_queue = settings.queue

redis_config = celery_redis_config(
    settings.storage.redis_url,
    broker_transport_options={"visibility_timeout": settings.visibility_timeout, **celery_transport_options()},
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
        Queue(generate_queue, Exchange(generate_queue), routing_key=generate_queue),
        Queue(WEBHOOK_QUEUE, Exchange(WEBHOOK_QUEUE), routing_key=WEBHOOK_QUEUE),
    ),
    task_default_queue=generate_queue,
    task_default_priority=BROKER_PRIORITY[DEFAULT_PRIORITY],
    task_routes={WEBHOOK_TASK: {"queue": WEBHOOK_QUEUE}},
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
)


def say_which_redis(location: RedisLocation) -> None:
    """Under Celery's command line (`celery -A worker inspect ...`, which loads this module while it
    reads `-A`), name the Redis it will talk to, on stderr so `--json` output stays parseable."""
    context = click.get_current_context(silent=True)
    if context is not None and context.command.name == "celery":
        print(f"stepwise: Redis {location.describe()}", file=sys.stderr)


say_which_redis(RedisLocation(settings.storage.redis_url, settings.storage.redis_source))
