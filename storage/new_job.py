"""What creating a job takes and gives back (JobStore.create_many)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batching.params import DEFAULT_MODEL
from storage.errors import StorageError
from storage.job_record import JobRecord, JobState
from storage.queues import DEFAULT_PRIORITY, generate_queue


class QueueFullError(StorageError):
    """As many jobs are queued as the creator allows (the API's STEPWISE_MAX_QUEUE_DEPTH)."""

    def __init__(self, num_queued: int) -> None:
        super().__init__(f"{num_queued} jobs are queued")
        self.num_queued = num_queued


@dataclass(frozen=True)
class NewJobSpec:
    tenant: str
    params: dict[str, Any]  # GenerationParams.to_dict(), seed drawn; params["model"] picks the queue
    deadline: float | None = None
    webhook_url: str | None = None
    webhook_events: list[str] = field(default_factory=list)
    idempotency_key: str | None = None
    request_hash: str | None = None  # identifies the request body for idempotent replays
    priority: str = DEFAULT_PRIORITY

    def new_record(self, job_id: str, now: float) -> JobRecord:
        assert self.tenant, "tenant must not be empty"
        return JobRecord(
            job_id=job_id, tenant=self.tenant, state=JobState.QUEUED, params=self.params, created_at=now,
            deadline=self.deadline, webhook_url=self.webhook_url, webhook_events=list(self.webhook_events),
            idempotency_key=self.idempotency_key, queue=generate_queue(self.params.get("model", DEFAULT_MODEL)),
            priority=self.priority,
        )


@dataclass(frozen=True)
class Created:
    record: JobRecord  # the new job, or the earlier one on an idempotent replay
    created: bool  # False: an idempotent replay (send no message)
    queue_position: int | None  # position among queued jobs of its model and priority, when created
