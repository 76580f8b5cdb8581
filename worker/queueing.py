"""Sending a job's generate message from the worker: re-queues, passes and the lease sweeper.

The message goes to the job's own queue at the job's own priority, both read from its record.
"""

from __future__ import annotations

from storage.job_record import JobRecord
from storage.queues import BROKER_PRIORITY, GENERATE_TASK
from worker.app import app


def send_generate(record: JobRecord) -> None:
    app.send_task(
        GENERATE_TASK,
        args=[record.job_id],
        queue=record.queue,
        priority=BROKER_PRIORITY.get(record.priority, BROKER_PRIORITY["normal"]),
    )
