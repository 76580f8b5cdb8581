from __future__ import annotations

import os

import boto3
import pytest

from tests.servers import S3_TEST_ENV, RedisServer, s3_env
from tests.worker.cluster import Cluster, WorkerProcess

WEBHOOK_SECRET = "whsec_" + "c3RlcHdpc2UtdGVzdHMtd2ViaG9vay1zZWNyZXQ="  # base64 of a test key
# Fast retries and a local receiver for webhook tests; short leases so recovery tests are quick.
TEST_WORKER_ENV = {
    "STEPWISE_WEBHOOK_SECRET": WEBHOOK_SECRET,
    "STEPWISE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
    "STEPWISE_WEBHOOK_BACKOFF": "0.2",
    "STEPWISE_WEBHOOK_MAX_ATTEMPTS": "3",
    "STEPWISE_PROGRESS_INTERVAL": "0.1",
    "STEPWISE_MAX_NUM_SEQS": "8",
}


def s3_client(endpoint_url: str):
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=S3_TEST_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_TEST_ENV["AWS_SECRET_ACCESS_KEY"],
    )


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
def folder_cluster(tmp_path) -> Cluster:
    """A deployment of this test's own, storing images in a local folder."""
    images = tmp_path / "images"
    cluster = Cluster(
        RedisServer(tmp_path / "redis").start(),
        {"STEPWISE_STORAGE_URL": images.resolve().as_uri()},
        tmp_path,
        extra_env=dict(TEST_WORKER_ENV),
        images=images,
    )
    yield cluster
    cluster.stop_all()
    cluster.redis.stop()
