from __future__ import annotations

import pytest
import requests

from tests.api.processes import ApiProcess
from tests.servers import RedisServer


@pytest.fixture(scope="module")
def module_redis(tmp_path_factory):
    """A redis-server for one test module: other modules' flushes cannot drop Celery's bindings under it."""
    server = RedisServer(tmp_path_factory.mktemp("api-redis"), appendonly=False).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def storage_url(tmp_path_factory) -> str:
    return tmp_path_factory.mktemp("images").as_uri()


@pytest.fixture(scope="module")
def api(module_redis, storage_url, tmp_path_factory):
    """`stepwise api` with three tenants (alice, bob, carol) and no worker: jobs stay queued."""
    server = ApiProcess(tmp_path_factory.mktemp("api"), module_redis.url, storage_url).start()
    yield server
    server.stop()


@pytest.fixture
def http():
    with requests.Session() as session:
        yield session
