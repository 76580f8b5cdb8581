"""A job's record and how it is laid out in its Redis hash.

Every value is stored as a string: the state as its lowercase name, floats with `repr` (exact
round trip), booleans as "1"/"0", lists and dicts as compact JSON. A field whose value is None
is absent from the hash. Fields the hash holds that the record does not know are ignored, so
an older reader survives a newer writer.
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from dataclasses import dataclass, field, fields
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


JOB_ID_PATTERN = re.compile(r"[0-9a-f]{32}")  # what new_job_id makes: nothing else names a job


def new_job_id() -> str:
    return uuid.uuid4().hex


def is_job_id(text: str) -> bool:
    """Whether `text` has the shape of a job id (32 lowercase hex digits): never a path, never empty."""
    return JOB_ID_PATTERN.fullmatch(text) is not None


HOLDER_SEPARATOR = "#"


def holder_token(worker_id: str, attempt: int) -> str:
    """The lease holder of one attempt at a job: `worker_id#attempt`. Every write a worker makes as the job's holder
    (renew, storing, end, re-queue) carries it, so an attempt the job was taken away from (re-queued behind its
    worker's back, then taken again, even by the same worker) can write nothing (storage.lua_preamble's holder_of)."""
    return f"{worker_id}{HOLDER_SEPARATOR}{attempt}"


def worker_of(holder: str) -> str:
    """The worker id in a holder token (worker ids may hold '#' themselves: the attempt is after the last)."""
    return holder.rpartition(HOLDER_SEPARATOR)[0]


# Why a running job went back to the queue (JobRecord.requeue_reason).
REQUEUE_REASONS = ("worker_lost", "lease_expired", "worker_shutdown", "worker_drained")

TERMINAL_STATES = tuple(state for state in JobState if state.is_terminal)
JOB_STATE_NAMES = tuple(state.value for state in JobState)  # what clients see in a job's `state`
TERMINAL_STATE_NAMES = frozenset(state.value for state in TERMINAL_STATES)


@dataclass
class JobRecord:
    job_id: str
    tenant: str
    state: JobState
    params: dict[str, Any]  # GenerationParams.to_dict(), seed already drawn
    created_at: float  # unix seconds
    queue: str  # the Celery queue of the job's model (storage.queue_names.generate_queue)
    started_at: float | None = None  # the first start: a re-queued job keeps it
    finished_at: float | None = None
    deadline: float | None = None  # unix seconds; not started by then -> expired
    complete_by: float | None = None  # unix seconds it should finish by (scheduling, and `late` in its view)
    progress_step: int = 0  # the job's own steps done (its images' mean: batching.job.JobProgress)
    progress_total: int = 0  # the job's step count: what each of its images runs, not summed over them
    progress_current_image: int = 0  # 1-based image it is on while its images run one after another; else 0
    image_keys: list[str] = field(default_factory=list)  # storage keys, one per image
    error_code: str | None = None
    error_message: str | None = None
    attempts: int = 0  # times a worker took the job
    queued_seconds: float | None = None  # time spent queued before the latest start, over all attempts
    requeued_at: float | None = None  # the latest time the job went back to the queue (None: never)
    requeue_reason: str | None = None  # why, as a code: worker_lost, lease_expired, worker_shutdown, worker_drained
    requeue_message: str | None = None  # why, in words
    worker_id: str | None = None  # the worker holding it while running (its attempt: `holder`)
    lease_expires_at: float | None = None  # running job's lease (renewed by its worker)
    cancel_requested: bool = False
    is_paused: bool = False  # running, set aside at a step boundary for a job that outranks it (its worker says)
    is_late: bool = False  # running, and its worker estimates it cannot finish by complete_by
    storing_since: float | None = None  # running, its images made and kept in its worker's spool since (unix s)
    storing_reason: str | None = None  # why they wait there: the image store's error (worker.spool)
    timings: dict[str, float] = field(default_factory=dict)  # queue_wait, denoise, decode, upload, total (seconds)
    webhook_url: str | None = None
    webhook_events: list[str] = field(default_factory=list)
    webhook_attempts: list[dict[str, Any]] = field(default_factory=list)  # one dict per delivery attempt
    idempotency_key: str | None = None
    priority: str = "normal"  # high, normal or low (core.params.PRIORITIES)
    preview_every: int | None = None  # a preview every this many steps (0: none); None: the worker's default

    @property
    def holder(self) -> str | None:
        """The lease holder of the running attempt (`holder_token`), derived from worker_id and attempts as the
        Lua scripts derive it; None unless a worker holds the job."""
        return holder_token(self.worker_id, self.attempts) if self.worker_id else None

    @property
    def first_started_at(self) -> float:
        """When a worker first took the job: a taken job's record always has it (the take script stamps it)."""
        if self.started_at is None:
            raise ValueError(f"job {self.job_id} has not been taken by a worker")
        return self.started_at

    def progress_view(self, total: int | None = None) -> dict[str, Any]:
        """The job's progress as clients see it (job view, event stream, progress webhooks): its own steps of its
        step count (`total`: the count to show before a worker wrote one), and, only while it runs its images one
        after another, `current_image` (1-based)."""
        view: dict[str, Any] = {"step": self.progress_step, "total": self.progress_total or (total or 0)}
        if self.state is JobState.RUNNING and self.progress_current_image:
            view["current_image"] = self.progress_current_image
        return view


RECORD_FIELDS = frozenset(f.name for f in fields(JobRecord))
_FLOAT_FIELDS = frozenset(
    {
        "created_at",
        "started_at",
        "finished_at",
        "deadline",
        "complete_by",
        "lease_expires_at",
        "queued_seconds",
        "requeued_at",
        "storing_since",
    }
)
_INT_FIELDS = frozenset({"progress_step", "progress_total", "progress_current_image", "attempts", "preview_every"})
_BOOL_FIELDS = frozenset({"cancel_requested", "is_paused", "is_late"})
_JSON_FIELDS = frozenset({"params", "image_keys", "timings", "webhook_events", "webhook_attempts"})


def encode_field(name: str, value: Any) -> str | None:
    """The hash value for one record field; None means "absent from the hash"."""
    assert name in RECORD_FIELDS, f"unknown job record field {name!r}"
    if value is None:
        return None
    if name == "state":
        return JobState(value).value
    if name in _FLOAT_FIELDS:
        return repr(float(value))
    if name in _INT_FIELDS:
        return str(int(value))
    if name in _BOOL_FIELDS:
        return "1" if value else "0"
    if name in _JSON_FIELDS:
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def decode_field(name: str, raw: str) -> Any:
    if name == "state":
        return JobState(raw)
    if name in _FLOAT_FIELDS:
        return float(raw)
    if name in _INT_FIELDS:
        return int(raw)
    if name in _BOOL_FIELDS:
        return raw == "1"
    if name in _JSON_FIELDS:
        return json.loads(raw)
    return raw


def record_to_hash(record: JobRecord) -> dict[str, str]:
    encoded = {f.name: encode_field(f.name, getattr(record, f.name)) for f in fields(JobRecord)}
    return {name: value for name, value in encoded.items() if value is not None}


def record_from_hash(mapping: dict[str, str]) -> JobRecord:
    values = {name: decode_field(name, raw) for name, raw in mapping.items() if name in RECORD_FIELDS}
    return JobRecord(**values)


def record_from_flat(items: list[str]) -> JobRecord:
    """A record from HGETALL's reply as a Lua script returns it: [field, value, field, value, ...]."""
    return record_from_hash(dict(zip(items[::2], items[1::2], strict=True)))
