from __future__ import annotations

import pytest

from api import create_app
from api.settings import ApiSettings
from storage.settings import StorageSettings
from storage.url_policy import AllowList
from tests.support.app_context import get_task_queue_of
from tests.support.processes import ADMIN_KEYS, TENANT_KEYS, ApiProcess, WorkerProcess
from tests.support.servers import RedisServer
from tests.support.web_page import headless_chromium


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
    # no worker: an OpenAI images call that passes validation would wait for nothing; it answers 504 soon
    server = ApiProcess(
        tmp_path_factory.mktemp("api"), module_redis.url, storage_url, STEPWISE_IMAGES_WAIT_SECONDS="0.2"
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def worker(module_redis, storage_url, tmp_path_factory):
    """`stepwise worker` serving builtin:tiny beside `api` (same Redis and storage)."""
    process = WorkerProcess(tmp_path_factory.mktemp("worker"), module_redis.url, storage_url).start()
    yield process
    process.stop()


@pytest.fixture
def app(redis_url, tmp_path):
    """The Flask app in this process (create_app with test settings) on the session's real Redis:
    for validation, auth and views, where no server process is needed."""
    settings = ApiSettings(
        api_keys=tuple(TENANT_KEYS.items()),
        admin_api_keys=tuple(ADMIN_KEYS.items()),
        storage=StorageSettings(redis_url=redis_url, storage_url=(tmp_path / "images").as_uri()),
        webhook_allow=AllowList.parse("127.0.0.1"),
        accept_unserved_models=True,  # no worker here: jobs for builtin:tiny queue, as for an autoscaled fleet
    )
    app = create_app({"TESTING": True, "API_SETTINGS": settings})
    yield app
    get_task_queue_of(app).close()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def browser():
    """Headless Chromium for the web page's tests (tests.support.web_page)."""
    yield from headless_chromium()
