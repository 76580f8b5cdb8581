"""Factories for storage tests: a hand-moved clock and jobs."""

from __future__ import annotations

from storage.job_store import JobRecord, JobStore


class FakeClock:
    """A clock the test moves by hand, so timestamps and leases are exact."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_job(store: JobStore, tenant: str = "acme", prompt: str = "a red fox", **kwargs) -> JobRecord:
    record, created = store.create(tenant=tenant, params={"prompt": prompt, "seed": 7}, **kwargs)
    assert created
    return record


def take_job(store: JobStore, job_id: str, worker_id: str = "w1", lease_seconds: int = 30) -> JobRecord:
    """Take `job_id` as a worker's feeder does, `take_next` on its queue, where it must be the next job. Returns the
    running record: its `holder` (`worker_id#attempt`) is what that worker's writes carry."""
    record = store.get(job_id)
    assert record is not None, f"no job {job_id}"
    taken = store.take_next(record.queue, worker_id, lease_seconds)
    assert taken is not None and taken.job_id == job_id, f"job {job_id} was not next in its queue"
    return taken
