"""What `create_app(test_config)` takes from its test config."""

from __future__ import annotations

import pytest

from api import create_app
from tests.support.app_context import get_task_queue_of
from tests.support.processes import TENANT_KEYS


def _add_failing_route(app) -> None:
    @app.get("/v1/fails")
    def fails():
        raise RuntimeError("a bug in a view")


def test_under_testing_an_unexpected_error_reaches_the_test_instead_of_a_bland_500(app):
    _add_failing_route(app)

    with pytest.raises(RuntimeError, match="a bug in a view"):
        app.test_client().get("/v1/fails")


def test_outside_testing_an_unexpected_error_answers_a_json_500(app):
    served = create_app({"API_SETTINGS": app.config["API_SETTINGS"]})
    _add_failing_route(served)
    try:
        response = served.test_client().get("/v1/fails")
    finally:
        get_task_queue_of(served).close()

    assert response.status_code == 500
    assert response.get_json() == {"error": {"code": "internal", "message": "internal server error"}}


def test_the_settings_in_the_test_config_replace_the_environment(app, monkeypatch):
    monkeypatch.setenv("STEPWISE_API_KEYS", "mallory:sk_env_mallory")
    configured = create_app({"TESTING": True, "API_SETTINGS": app.config["API_SETTINGS"]})
    try:
        client = configured.test_client()
        from_env = client.get("/v1/jobs", headers={"Authorization": "Bearer sk_env_mallory"})
        from_config = client.get("/v1/jobs", headers={"Authorization": f"Bearer {TENANT_KEYS['alice']}"})
    finally:
        get_task_queue_of(configured).close()

    assert (from_env.status_code, from_config.status_code) == (401, 200)
