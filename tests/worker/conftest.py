"""The worker tests' shared deployment on S3 and its one worker."""

from __future__ import annotations

import os
import time

import pytest

from storage.settings import StorageSettings
from tests.support.cluster import TEST_WORKER_ENV, Cluster, s3_client
from tests.support.paced_engine import PacedEngine
from tests.support.processes import WorkerProcess
from tests.support.servers import RedisServer, s3_env
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings


@pytest.fixture(scope="session")
def s3_cluster(s3_server, tmp_path_factory) -> Cluster:
    """One deployment shared by the worker tests that do not stop workers: own Redis, a bucket on
    moto's S3 server, one worker (`s3_cluster.main`)."""
    bucket = f"stepwise-workers-{os.urandom(3).hex()}"
    s3_client(s3_server.endpoint_url).create_bucket(Bucket=bucket)
    root = tmp_path_factory.mktemp("s3-cluster")
    cluster = Cluster(
        RedisServer(root / "redis").start(),
        s3_env(s3_server.endpoint_url, bucket),
        root,
        extra_env=dict(TEST_WORKER_ENV),
        bucket=bucket,
        s3=s3_client(s3_server.endpoint_url),
    )
    try:
        cluster.main = cluster.start_worker("main")
        yield cluster
    finally:
        cluster.stop_all()
        cluster.redis.stop()


@pytest.fixture
def main_worker(s3_cluster) -> WorkerProcess:
    worker = s3_cluster.main
    assert worker.is_alive(), f"the shared worker died:\n{worker.log_tail()}"
    return worker


@pytest.fixture
def paced_runtime(redis_url, tmp_path) -> WorkerRuntime:
    """The worker's own code in this process (runtime, job threads, real Redis) on an engine whose steps take a
    known time (`PacedEngine`), so what a test decides from step times does not depend on how busy the machine is."""
    settings = WorkerSettings(
        storage=StorageSettings(redis_url=redis_url, storage_url=(tmp_path / "images").as_uri()),
        poll_interval=0.05,
        progress_interval=0.05,
        redis_retry_seconds=5,
        spool_dir=str(tmp_path / "spool"),
    )
    runtime = WorkerRuntime(settings, f"paced-worker-{time.monotonic_ns()}")
    runtime._engine = PacedEngine()  # type: ignore[assignment]
    yield runtime
    runtime.leases.stop()
    runtime.job_store.close()
