"""Fault and abuse tests reuse the worker tests' deployments (`tests.worker.cluster`) and the API
tests' processes (`tests.api.processes`); nothing here starts a process its own way."""

from __future__ import annotations

from tests.worker.conftest import TEST_WORKER_ENV, folder_cluster, s3_client  # noqa: F401 (fixtures)

# Leases of a few seconds so a dead worker's jobs come back quickly, and a broker visibility
# timeout of ten hours, so nothing in these tests can be rescued by Redis redelivering a message.
FAST_RECOVERY = {
    "STEPWISE_JOB_LEASE_SECONDS": "3",
    "STEPWISE_LEASE_SWEEP_INTERVAL": "0.5",
    "STEPWISE_VISIBILITY_TIMEOUT": "36000",
}
