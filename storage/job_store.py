"""Job records in Redis: one hash per job, atomic state transitions, per-tenant index.

CONTRACT SKELETON (to be implemented): the signatures below are what the worker and the
API code against. Keep names and semantics; add what you need.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    EXPIRED = "expired"

    @property
    def is_terminal(self) -> bool:
        return self not in (JobState.QUEUED, JobState.RUNNING)


@dataclass
class JobRecord:
    job_id: str
    tenant: str
    state: JobState
    params: dict[str, Any]  # GenerationParams.to_dict(), seed already drawn
    created_at: float  # unix seconds
    started_at: float | None = None
    finished_at: float | None = None
    deadline: float | None = None  # unix seconds; not started by then -> expired
    progress_step: int = 0
    progress_total: int = 0
    image_keys: list[str] = field(default_factory=list)  # storage keys, one per image
    error_code: str | None = None
    error_message: str | None = None
    attempts: int = 0  # times a worker took the job
    worker_id: str | None = None  # holder while running
    lease_expires_at: float | None = None  # running job's lease (renewed by its worker)
    cancel_requested: bool = False
    timings: dict[str, float] = field(default_factory=dict)  # queue_wait, denoise, decode, upload, total (seconds)
    webhook_url: str | None = None
    webhook_events: list[str] = field(default_factory=list)
    webhook_attempts: list[dict[str, Any]] = field(default_factory=list)  # one dict per delivery attempt
    idempotency_key: str | None = None


class StorageError(Exception):
    """Base of every error raised by the `storage` package."""


class IdempotencyConflictError(StorageError):
    """The idempotency key was used before with a different request body."""


class InvalidTransitionError(StorageError):
    """The job is not in a state that allows this transition (for example it is terminal)."""


class JobStore:
    def __init__(self, redis_url: str, *, job_ttl_seconds: int = 7 * 24 * 3600, namespace: str = "stepwise") -> None: ...

    def ping(self) -> bool: ...
    def create(self, *, tenant: str, params: dict[str, Any], deadline: float | None = None,
               webhook_url: str | None = None, webhook_events: list[str] | None = None,
               idempotency_key: str | None = None, request_hash: str | None = None) -> tuple[JobRecord, bool]:
        """Create a queued job. Returns (record, created). Same tenant+idempotency_key with the
        same request_hash returns the original (created=False); a different hash raises
        IdempotencyConflictError."""
    def get(self, job_id: str) -> JobRecord | None: ...
    def list_for_tenant(self, tenant: str, *, state: JobState | None = None, limit: int = 20,
                        cursor: str | None = None) -> tuple[list[JobRecord], str | None]:
        """Newest first; returns (records, next_cursor or None)."""
    def queue_position(self, job_id: str) -> int | None:
        """0-based position among queued jobs (oldest first), None if not queued."""
    def queue_depth(self) -> int: ...
    def counts_by_state(self) -> dict[str, int]: ...
    def take(self, job_id: str, worker_id: str, lease_seconds: int) -> JobRecord | None:
        """Atomically queued -> running (attempts+1, started_at, lease). None if the job is not
        queued (terminal, or another worker holds it)."""
    def renew_lease(self, job_id: str, worker_id: str, lease_seconds: int) -> bool: ...
    def set_progress(self, job_id: str, step: int, total: int) -> None: ...
    def finish(self, job_id: str, state: JobState, *, worker_id: str | None = None, **fields: Any) -> bool:
        """Atomically move a non-terminal job to a terminal state with extra fields (image_keys,
        timings, error_code, error_message). Refused (False) if already terminal."""
    def request_cancel(self, job_id: str) -> JobState:
        """Queued -> canceled at once; running -> cancel_requested flag (the worker stops it at the
        next step boundary). Raises InvalidTransitionError if terminal. Returns the new state."""
    def is_cancel_requested(self, job_id: str) -> bool: ...
    def release(self, job_id: str, worker_id: str) -> bool:
        """Running -> queued again (warm shutdown or a lapsed lease); the caller re-enqueues it."""
    def lapsed_job_ids(self, now: float | None = None) -> list[str]:
        """Running jobs whose lease expired."""
    def add_webhook_attempt(self, job_id: str, attempt: dict[str, Any]) -> None: ...
    def close(self) -> None: ...
