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
