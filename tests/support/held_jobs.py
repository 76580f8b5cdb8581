"""A job held by an in-process worker runtime without a record in Redis, for tests of what the runtime does with a
held job (its submit, a drain, a lost lease)."""

from __future__ import annotations

from storage.job_record import JobRecord, JobState
from worker.held_job import HeldJob
from worker.runtime import WorkerRuntime


def hold(runtime: WorkerRuntime, job_id: str, tenant: str = "tests") -> HeldJob:
    """`job_id`, as if this worker's feeder had just taken its first attempt."""
    record = JobRecord(job_id, tenant, JobState.RUNNING, {}, 0.0, "q", worker_id=runtime.worker_id, attempts=1)
    held = runtime.held.take(record)
    assert held is not None
    return held
