"""The API's Celery client: it only sends tasks by name and never imports the worker.

Jobs are not Celery messages: the job store queues each in its model's queue and wakes that model's
workers in the same script (`storage.lua.CREATE`, `worker.feeder`). What the API sends through Celery
is webhook deliveries, on their own queue, so a slow webhook receiver never delays generation.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from storage.queue_names import WEBHOOK_QUEUE, WEBHOOK_TASK
from storage.redis_clients import celery_redis_config


class TaskQueue:
    def __init__(self, broker_url: str) -> None:
        redis_config = celery_redis_config(broker_url, broker_transport_options={})
        self.celery = Celery("stepwise-api", broker=redis_config.pop("broker_url"), set_as_current=False)
        self.celery.conf.update(
            **redis_config,  # the transport options, and with Sentinel the master's name and TLS
            broker_connection_timeout=3,
            task_send_sent_event=True,  # Flower shows webhook deliveries from the moment they are queued
            task_publish_retry_policy={
                "max_retries": 2,
                "interval_start": 0,
                "interval_step": 0.2,
                "interval_max": 0.5,
            },
        )

    def enqueue_webhook(self, job_id: str, event: str, webhook_id: str, payload: dict[str, Any]) -> None:
        self.celery.send_task(WEBHOOK_TASK, args=[job_id, event, webhook_id, payload], queue=WEBHOOK_QUEUE)

    def close(self) -> None:
        self.celery.close()
