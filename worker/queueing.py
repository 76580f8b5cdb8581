"""Sending a job's generate message from the worker: re-queues, passes and the lease sweeper.

The message goes to the job's own queue at the job's own priority, both read from its record
(a record written before per-model queues has no queue: its model's queue is derived).
"""

from __future__ import annotations

from batching.params import DEFAULT_MODEL
from storage.job_record import JobRecord
from storage.queues import BROKER_PRIORITY, GENERATE_TASK, generate_queue
from worker.app import app


def job_queue(record: JobRecord) -> str:
    return record.queue or generate_queue(record.params.get("model", DEFAULT_MODEL))


def send_generate(record: JobRecord) -> None:
    app.send_task(
        GENERATE_TASK,
        args=[record.job_id],
        queue=job_queue(record),
        priority=BROKER_PRIORITY.get(record.priority, BROKER_PRIORITY["normal"]),
    )
