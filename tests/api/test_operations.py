"""Health, readiness, Prometheus metrics and the OpenAPI document."""

from __future__ import annotations

import re
import shutil
import time

import pytest

from api.openapi import UndocumentedRoute, build_document
from storage.heartbeats import Heartbeat
from storage.job_store import JobStore
from tests.support.calls import auth, submit
from tests.support.routes import ROUTES


@pytest.mark.e2e
def test_healthz_and_readyz_answer_ok_when_redis_and_storage_are_up_and_readyz_warns_that_no_worker_runs(api, http):
    assert http.get(f"{api.url}/healthz", timeout=10).json() == {"status": "ok"}
    ready = http.get(f"{api.url}/readyz", timeout=10).json()
    assert ready["status"] == "ok" and ready["checks"] == {"redis": True, "storage": True}
    assert ready["workers"] == {
        "seen_recently": False,
        "num_workers": 0,
        "num_draining": 0,
        "num_spooling": 0,
        "num_spool_full": 0,
        "available_models": [],
        "last_seen": None,
    }
    assert len(ready["warnings"]) == 1 and "no worker has been seen" in ready["warnings"][0]


@pytest.mark.e2e
def test_metrics_show_jobs_by_state_queue_depth_and_request_latency(api, http):
    submit(http, api, {"prompt": "a metric", "num_inference_steps": 2})
    for _ in range(4):  # reach both API worker processes
        http.get(f"{api.url}/healthz", timeout=10)

    text = http.get(f"{api.url}/metrics", headers=auth("ops"), timeout=10).text
    assert "tenant" not in text  # no series names a tenant

    assert re.search(r'^stepwise_jobs\{state="queued"\} [1-9]', text, re.M)
    assert re.search(r"^stepwise_queue_depth [1-9]", text, re.M)
    assert re.search(
        r'^stepwise_api_request_duration_seconds_count\{method="POST",route="/v1/jobs"\} [1-9]', text, re.M
    )
    healthz_count = re.search(
        r'^stepwise_api_requests_total\{method="GET",route="/healthz",status="200"\} (\S+)', text, re.M
    )
    assert healthz_count and float(healthz_count.group(1)) >= 4  # summed over the workers


@pytest.mark.e2e
def test_the_openapi_document_covers_every_route_with_the_engines_limits(api, http):
    document = http.get(f"{api.url}/openapi.json", timeout=10).json()

    assert document["openapi"].startswith("3.")
    assert {(path, method) for path, item in document["paths"].items() for method in item} == ROUTES
    job = document["components"]["schemas"]["JobRequest"]["properties"]
    assert job["height"]["maximum"] == 2048 and job["height"]["multipleOf"] == 8
    samplers = next(option["enum"] for option in job["sampler"]["anyOf"] if "enum" in option)  # or null: the family's
    assert samplers == ["ddim", "euler", "euler_ancestral", "dpmpp_2m", "unipc"]
    num_frames = next(option for option in job["num_frames"]["anyOf"] if option.get("type") == "integer")
    assert num_frames["maximum"] == 161
    assert document["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


UNDOCUMENTED = {("/", "get"), ("/static/{filename}", "get")}  # the web page and its files: not the JSON API


def test_the_openapi_document_has_exactly_the_paths_and_methods_the_app_routes(app, client):
    document = client.get("/openapi.json").json
    routed = {
        (re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule), method.lower())
        for rule in app.url_map.iter_rules()
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }

    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert documented == routed - UNDOCUMENTED


def test_a_route_that_declares_no_operation_stops_the_document_from_being_built(app):
    @app.get("/v1/undeclared")
    def undeclared():
        return {}

    with pytest.raises(UndocumentedRoute, match="/v1/undeclared"):
        build_document(app, app.config["API_SETTINGS"])


def test_each_route_answers_a_call_without_a_key_as_its_documented_security_says(client):
    """The document's auth comes from each route's blueprint hook: no key is 401 exactly where it says a key is
    needed, and an admin route documents 403 too."""
    document = client.get("/openapi.json").json
    for path, item in document["paths"].items():
        concrete = path.replace("{job_id}", "no-such-job").replace("{name}", "no-such-adapter")
        concrete = concrete.replace("{video_id}", "no-such-video")
        for method, operation in item.items():
            needs_key = operation.get("security", document["security"]) != []
            answer = client.open(concrete, method=method.upper())
            assert (answer.status_code == 401) == needs_key, (path, method, answer.status_code)
            assert ("401" in operation["responses"]) == needs_key, (path, method)
            is_admin_route = path == "/metrics" or path.startswith("/v1/admin/")
            assert ("403" in operation["responses"]) == is_admin_route, (path, method)


def test_readyz_and_the_model_list_say_which_workers_hold_images_for_storage_and_whose_spool_is_full(client, redis_url):
    spools = [
        {"num_jobs": 3, "num_bytes": 40_000, "max_bytes": 1, "is_full": True, "storage_error": "S3 is down"},
        {"num_jobs": 1, "num_bytes": 9_000, "max_bytes": 10**9, "is_full": False, "storage_error": "S3 is down"},
    ]
    with JobStore(redis_url) as store:
        for index, spool in enumerate(spools):
            store.beat(
                Heartbeat(
                    f"w{index}", "builtin:tiny", "stepwise.generate.builtin-tiny", "sd", 8, time.time(), spool=spool
                )
            )

    ready = client.get("/readyz").get_json()
    models = client.get("/v1/models", headers=auth()).get_json()["models"]

    assert (ready["workers"]["num_spooling"], ready["workers"]["num_spool_full"]) == (2, 1)
    assert any("1 of 2 workers have a full spool" in warning for warning in ready["warnings"]), ready["warnings"]
    assert (models[0]["spooling"], models[0]["spool_full"]) == (2, 1)


def test_with_image_storage_down_the_api_stays_ready_to_take_jobs_and_says_where_their_images_wait(client, tmp_path):
    images = tmp_path / "images"
    shutil.rmtree(images, ignore_errors=True)
    images.write_text("the image folder is gone: a file stands at its path")

    response = client.get("/readyz")
    submitted = client.post("/v1/jobs", json={"prompt": "during the outage"}, headers=auth())

    assert response.status_code == 200 and response.get_json()["checks"] == {"redis": True, "storage": False}
    assert "images wait in the workers' spools" in response.get_json()["warnings"][0]
    assert submitted.status_code == 202
