from __future__ import annotations

import os

import boto3
import pytest
import redis
import requests

import tests.support.one_thread  # noqa: F401  (before anything imports torch: see its docstring)
import tests.support.own_var_dir  # noqa: F401  (first of the project's: see its docstring)
from tests.support import parallel, tiers
from tests.support.cluster import Cluster, local_folder_cluster
from tests.support.servers import S3_TEST_ENV, MotoS3Server, RedisServer, SeaweedS3Server


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: a worker or browser test is an e2e test too
def pytest_collection_modifyitems(items):
    for item in items:
        tiers.add_implied(item)
    parallel.heaviest_units_first(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s `--dist loadgroup`: files and groups as units, heaviest first (tests/support/parallel.py)."""
    if config.getvalue("dist") == "loadgroup":
        return parallel.FileOrGroupScheduling(config, log)
    return None


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures start anything
def pytest_runtest_setup(item):
    tiers.set_running(item)


@pytest.fixture(scope="session", autouse=True)
def own_state_folder(tmp_path_factory):
    """`$XDG_STATE_HOME` of this test process's own, for it and the processes it starts: a worker's default
    spool is there, and a worker adopts the spooled jobs of any stopped worker in its spool, so the workers of
    tests running in parallel (pytest-xdist) must not share one (nor with anything else on this machine)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
        yield


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
