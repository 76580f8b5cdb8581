"""Sending generate messages from the worker: re-queues, passes and the lease sweeper.

A message takes its queue's next job, whichever it is (`worker.tasks`). A re-queued job's message goes
to the job's own queue at the job's own priority, both read from its record.
"""

from __future__ import annotations

from storage.job_record import JobRecord
from storage.queue_names import BROKER_PRIORITY, GENERATE_TASK
from worker.app import app
from worker.leases import queue_name as job_queue


def send_generate(record: JobRecord) -> None:
    send_ticket(job_queue(record), record.job_id, record.priority)


def send_ticket(queue: str, job_id: str, priority: str = "normal") -> None:
    """A generate message for `queue`, naming `job_id` (the job it was sent for)."""
    app.send_task(
        GENERATE_TASK, args=[job_id], queue=queue, priority=BROKER_PRIORITY.get(priority, BROKER_PRIORITY["normal"])
    )
