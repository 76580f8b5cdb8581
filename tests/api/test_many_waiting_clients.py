"""Waiting clients cost the API no request thread: with 500 `Prefer: wait` submits and 500 open event
streams held, `/healthz` still answers every probe quickly (`stepwise api`: granian through the RSGI
bridge, 2 processes x 4 threads).

The load is benchmarks/waiting_clients.py's (its numbers, p99 included, are in docs/api.md); here
the bound is what a health checker notices: every probe answered, none slower than a second (a
waiting request holding a thread would leave the 8 threads taken, and probes unanswered).
"""

from __future__ import annotations

import pytest
import redis

from benchmarks.waiting_clients import hold_waiting_clients, probe_healthz
from storage.job_store import JobStore
from tests.support.processes import TENANT_KEYS, ApiProcess

pytestmark = pytest.mark.e2e

NUM_WAITS = 500
NUM_STREAMS = 500
PROBE_TIMEOUT_SECONDS = 1.0  # what a health checker such as Kubernetes' waits by default


@pytest.fixture(scope="module")
def server(module_redis, storage_url, tmp_path_factory):
    api = ApiProcess(
        tmp_path_factory.mktemp("api"),
        module_redis.url,
        storage_url,
        STEPWISE_API_MAX_CONNECTIONS="4000",  # 1,000 held clients may all land on one of the 2 processes
    ).start()
    yield api
    api.stop()


def test_500_waiting_submits_and_500_event_streams_leave_healthz_answering(server, module_redis):
    client = redis.Redis.from_url(module_redis.url)
    with hold_waiting_clients(
        server.url,
        TENANT_KEYS["alice"],
        num_waits=NUM_WAITS,
        num_streams=NUM_STREAMS,
        num_queued=lambda: client.zcard("stepwise:queued"),
    ) as held:
        latencies = probe_healthz(server.url, 100, timeout=PROBE_TIMEOUT_SECONDS)
        answered_early = held.num_answered_early
    cancel_all_queued(module_redis.url)  # ends the waits and streams the server still holds

    assert None not in latencies, f"{latencies.count(None)} of 100 probes got no answer within 1s"
    assert answered_early == 0  # every waiting submit was still waiting while the probes ran


def cancel_all_queued(redis_url: str) -> None:
    with JobStore(redis_url) as store:
        for job_id in store.redis.zrange("stepwise:queued", 0, -1):
            store.request_cancel(job_id)
