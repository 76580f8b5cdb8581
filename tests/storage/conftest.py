from __future__ import annotations

import pytest

from storage.job_store import JobStore
from tests.support.job_factories import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(redis_url, clock):
    with JobStore(redis_url, job_ttl_seconds=3600, clock=clock) as job_store:
        yield job_store
