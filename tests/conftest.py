from __future__ import annotations

import os
import shutil
import tempfile

import boto3
import pytest
import redis
import requests

from tests.support.cluster import Cluster, local_folder_cluster
from tests.support.servers import S3_TEST_ENV, MotoS3Server, RedisServer, SeaweedS3Server


def pytest_configure(config):
    """Every stepwise process finds its Redis through `<STEPWISE_VAR_DIR>/stepwise.json` when no URL is set, and
    refuses to start when that file names a `stepwise up` that stopped (storage.redis_location). The checkout's
    var/ is the user's (a `make run` here, running or not): the tests, which name their own Redis, look in a folder
    of their own, set before any test module imports the worker's settings."""
    var_dir = tempfile.mkdtemp(prefix="stepwise-tests-var-")
    os.environ["STEPWISE_VAR_DIR"] = var_dir
    config.add_cleanup(lambda: shutil.rmtree(var_dir, ignore_errors=True))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One real redis-server for the session, on its own free port."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    """A clean database on the session's redis-server."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own, which the test may stop and restart."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server():
    server = MotoS3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A fresh bucket on moto's S3 server; AWS_* variables set for boto3 in this process."""
    for name, value in S3_TEST_ENV.items():
        monkeypatch.setenv(name, value)
    name = f"stepwise-{os.urandom(4).hex()}"
    client = boto3.client("s3", endpoint_url=s3_server.endpoint_url, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory):
    """SeaweedFS's S3 server for the session: real signature, presigned-URL and credential checks."""
    server = SeaweedS3Server(tmp_path_factory.mktemp("seaweed")).start()
    yield server
    server.stop()


@pytest.fixture
def seaweed_bucket(seaweed_server, monkeypatch):
    """A fresh bucket on SeaweedFS; AWS_* variables set for boto3 in this process."""
    for name, value in S3_TEST_ENV.items():
        monkeypatch.setenv(name, value)
    name = f"stepwise-{os.urandom(4).hex()}"
    client = boto3.client("s3", endpoint_url=seaweed_server.endpoint_url, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    client.close()
    return name


@pytest.fixture
def http():
    """An HTTP session for the tests that talk to a server process."""
    with requests.Session() as session:
        yield session


@pytest.fixture
def folder_cluster(tmp_path) -> Cluster:
    """A deployment of this test's own (worker and fault tests), storing images in a local folder."""
    cluster = local_folder_cluster(tmp_path)
    yield cluster
    cluster.stop_all()
    cluster.redis.stop()
