"""Generate-task messages, built the way Celery and kombu build them, without a publish per job.

`celery.send_task` costs about a millisecond of CPU per message (routing, declarations, a retry
wrapper and a task-sent event), more than everything else a submit does. Every generate message
differs from the next only in the job id (which is also the task id and the one argument) and a
fresh delivery tag; so for each queue and priority Celery (`as_task_v2`) and kombu's Redis channel
(`prepare_message`, `basic_publish` into a capturing batch, which does no I/O) build the message
once, and each job gets a copy with its own id. The job store then pushes it onto the queue's
Redis list in the same atomic script that stores the record (storage.lua.CREATE), so a job is
never stored without its message nor sent without its record.

The template is checked when it is built: if the placeholder id shows up anywhere but the fields
filled in per job (a future Celery protocol), building fails loudly rather than sending wrong ids.
Generate messages sent this way carry no task-sent event: Flower shows a job once a worker
receives it.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from typing import Any

from celery import Celery

from storage.job_record import JobRecord
from storage.queue_names import BROKER_PRIORITY, GENERATE_TASK

PLACEHOLDER_ID = "f" * 32  # as long as a job id, and a string no real job id or header equals


class MessageTemplateError(RuntimeError):
    """Celery's message for the generate task holds the job id somewhere this module does not fill in."""


class _Capture:
    """Stands in for kombu's PublishBatch: keeps the Redis command instead of sending it."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, tuple]] = []

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name, args))


class GenerateMessages:
    def __init__(self, celery: Celery) -> None:
        self.celery = celery
        self._templates: dict[tuple[str, str], tuple[str, dict]] = {}  # (queue, priority) -> (list key, message)
        self._lock = threading.Lock()

    def for_record(self, record: JobRecord) -> tuple[str, str]:
        """(Redis list, payload) of the job's generate message, for its queue and priority."""
        key, template = self._template(record.queue, record.priority)
        job_id = record.job_id
        headers = {**template["headers"], "id": job_id, "root_id": job_id, "argsrepr": repr([job_id])}
        properties = {**template["properties"], "correlation_id": job_id, "delivery_tag": str(uuid.uuid4())}
        body = json.dumps([[job_id], {}, template["embed"]]).encode()
        message = {
            **template["message"],
            "headers": headers,
            "properties": properties,
            "body": base64.b64encode(body).decode(),
        }
        return key, json.dumps(message)

    def _template(self, queue: str, priority: str) -> tuple[str, dict]:
        with self._lock:
            if (queue, priority) not in self._templates:
                self._templates[(queue, priority)] = self._build(queue, priority)
            return self._templates[(queue, priority)]

    def _build(self, queue: str, priority: str) -> tuple[str, dict]:
        task = self.celery.amqp.as_task_v2(PLACEHOLDER_ID, GENERATE_TASK, args=[PLACEHOLDER_ID])
        args, kwargs, embed = task.body
        if args != [PLACEHOLDER_ID] or kwargs:
            raise MessageTemplateError(f"unexpected generate task body {task.body!r}")
        capture = _Capture()
        with self.celery.connection_for_write() as connection:
            channel = connection.default_channel
            message = channel.prepare_message(
                json.dumps(task.body),
                BROKER_PRIORITY[priority],
                "application/json",
                "utf-8",
                dict(task.headers),
                dict(task.properties),
            )
            channel.basic_publish(message, exchange="", routing_key=queue, _publish_batch=capture)
        [(command, (key, payload))] = capture.commands
        built = json.loads(payload)
        if command != "lpush" or json.loads(base64.b64decode(built["body"])) != [[PLACEHOLDER_ID], {}, embed]:
            raise MessageTemplateError(f"unexpected kombu message for the generate task: {payload[:200]}")
        rest = {
            **built,
            "body": None,
            "headers": {**built["headers"], "id": None, "root_id": None, "argsrepr": None},
            "properties": {**built["properties"], "correlation_id": None, "delivery_tag": None},
        }
        if PLACEHOLDER_ID in json.dumps(rest):
            raise MessageTemplateError("the generate task message holds the task id in a field not filled per job")
        return key, {"message": built, "headers": built["headers"], "properties": built["properties"], "embed": embed}
