"""Every rule of the engine's parameter validation answers 422 naming the field; nothing answers 500.

In-process (create_app + test_client) on a real Redis: no server process is needed to check validation.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from core import params as P
from core import step_cache
from tests.support.calls import auth

HOOK = "http://127.0.0.1:9/hook"  # the test server allows 127.0.0.1 (STEPWISE_WEBHOOK_ALLOW_HOSTS)
VALID = {"prompt": "a red fox", "seed": 1, "num_inference_steps": 2}

# (field, bad value): one case per rule in core/params.py, and the API's own fields. A value computed from the
# clock gets an id of its own: parallel workers (pytest-xdist) collect at different moments and need equal ids.
NOW = datetime.now(UTC)
INVALID_FIELDS = [
    ("prompt", ""),
    ("prompt", "   "),
    ("prompt", "x" * (P.MAX_PROMPT_CHARS + 1)),
    ("prompt", 5),
    ("prompt", "nul\x00byte"),
    ("prompt", None),
    ("negative_prompt", "x" * (P.MAX_PROMPT_CHARS + 1)),
    ("negative_prompt", 3),
    ("negative_prompt", "a\x00"),
    ("height", P.MIN_SIZE - P.SIZE_MULTIPLE),
    ("height", P.MAX_SIZE + P.SIZE_MULTIPLE),
    ("height", 100),
    ("height", "128"),
    ("height", 128.5),
    ("height", True),
    ("width", P.MIN_SIZE - P.SIZE_MULTIPLE),
    ("width", P.MAX_SIZE + P.SIZE_MULTIPLE),
    ("width", 130),
    ("width", None),
    ("num_inference_steps", P.MIN_STEPS - 1),
    ("num_inference_steps", P.MAX_STEPS + 1),
    ("num_inference_steps", 2.5),
    ("guidance_scale", P.MIN_GUIDANCE - 0.5),
    ("guidance_scale", P.MAX_GUIDANCE + 0.5),
    ("guidance_scale", "7"),
    ("guidance_scale", False),
    ("seed", -1),
    ("seed", P.MAX_SEED + 1),
    ("seed", 1.5),
    ("seed", "42"),
    ("sampler", "heun"),
    ("sampler", 1),
    ("num_images", 0),
    ("num_images", P.MAX_NUM_IMAGES + 1),
    ("model", ""),
    ("model", "m" * 501),
    ("model", "builtin:tiny\n"),  # no worker could serve it: the job would wait until it expired
    ("model", "a\x85b"),
    ("num_frames", 0),
    ("num_frames", 2),  # builtin:tiny draws images: one frame
    ("num_frames", 9),
    ("fps", 16),  # a video's
    ("output_format", "mp4"),  # a video format, for an image model
    ("output_format", "avi"),
    ("lora", ""),
    ("lora", "l" * 501),
    ("lora", 7),
    ("lora_scale", P.MAX_LORA_SCALE + 1),
    ("lora_scale", -P.MAX_LORA_SCALE - 1),
    ("cache", "fastest"),
    ("cache", 0),
    ("cache", -0.1),
    ("cache", step_cache.MAX_THRESHOLD + 0.5),
    ("cache", True),
    ("cache", ["fast"]),
    ("not_a_field", 1),
    # Loopback spellings only: private and metadata addresses are checked against the policy function directly
    # (tests/faults/test_abuse.py); 127.0.0.2 is outside this app's allow list (127.0.0.1).
    ("webhook_url", "ftp://127.0.0.1/hook"),
    ("webhook_url", "not a url"),
    ("webhook_url", "http://127.0.0.2/hook"),
    ("webhook_url", "http://[::1]/latest"),
    ("webhook_url", "http://user:pw@127.0.0.1/"),
    ("webhook_url", ""),
    # URLs the worker's HTTP client could never send: before, accepted here and failed at every delivery
    # (or answered 500, for the unbalanced bracket that urlsplit raises on)
    ("webhook_url", "http://[::1/hook"),
    ("webhook_url", "http://127.0.0.1/caf\u00e9"),
    ("webhook_url", "http://127.0.0.1/a b"),
    ("webhook_url", "http://127.0.0.1/hook\r\nX-Injected: 1"),
    ("webhook_url", "http://127.0.0.1:0/hook"),
    ("webhook_events", ["started", "exploded"]),
    ("webhook_events", []),
    ("webhook_events", "started"),
    ("deadline", "tomorrow"),
    ("deadline", "2030-01-01T00:00:00"),
    pytest.param("deadline", (NOW - timedelta(minutes=1)).isoformat(), id="'deadline'-a minute ago"),
    ("complete_by", "soon"),
    ("complete_by", "2030-01-01T00:00:00"),
    ("complete_by", 1900000000),
    pytest.param("complete_by", (NOW - timedelta(minutes=1)).isoformat(), id="'complete_by'-a minute ago"),
    pytest.param("complete_by", (NOW + timedelta(days=31)).isoformat(), id="'complete_by'-in 31 days"),
    ("slo_seconds", 0),
    ("slo_seconds", -5),
    ("slo_seconds", "30"),
    ("slo_seconds", 31 * 24 * 3600),
    ("slo_seconds", True),
]


def post_job(client, body):
    return client.post("/v1/jobs", json=body, headers=auth())


@pytest.mark.parametrize(("field", "value"), INVALID_FIELDS, ids=lambda v: repr(v)[:40])
def test_each_invalid_field_gets_422_naming_that_field(client, field, value):
    body = {**VALID, field: value}
    if field == "webhook_events":
        body["webhook_url"] = HOOK

    response = post_job(client, body)

    assert response.status_code == 422, response.text
    error = response.get_json()["error"]
    assert error["code"] == "invalid_params"
    assert error["field"] == field or error["field"].startswith(f"{field}[")  # webhook_events[1]: the bad item
    assert field in error["message"]


def test_a_missing_prompt_is_named(client):
    response = post_job(client, {"seed": 1})

    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == "prompt"


def test_webhook_events_without_a_webhook_url_are_refused(client):
    response = post_job(client, {**VALID, "webhook_events": ["completed"]})

    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == "webhook_events"


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"{'prompt': 'x'}",
        b"",
        b"\xff\xfe",
        b'{"prompt": NaN}',
        b'{"prompt": "x", "guidance_scale": Infinity}',
        b"[" * 100_000,
    ],
)
def test_malformed_json_gets_400(client, body):
    response = client.post("/v1/jobs", data=body, headers={**auth(), "Content-Type": "application/json"})

    assert response.status_code == 400, response.text
    assert response.get_json()["error"]["code"] == "malformed_json"


def test_a_latin_1_body_gets_400_saying_json_is_utf_8_whatever_its_charset_says(client):
    response = client.post(
        "/v1/jobs",
        data='{"prompt": "caf\u00e9"}'.encode("latin-1"),
        headers={**auth(), "Content-Type": "application/json; charset=latin-1"},
    )

    assert response.status_code == 400
    assert "not UTF-8" in response.get_json()["error"]["message"]


@pytest.mark.parametrize("body", [[], "a red fox", 42, None])
def test_a_body_that_is_not_an_object_gets_422(client, body):
    response = client.post("/v1/jobs", data=json.dumps(body), headers={**auth(), "Content-Type": "application/json"})

    assert response.status_code == 422
    assert "must be a JSON object" in response.get_json()["error"]["message"]


def test_a_field_name_that_is_not_text_gets_422_saying_why(client):
    response = client.post(
        "/v1/jobs", data=b'{"prompt": "x", "\\ud800": 1}', headers={**auth(), "Content-Type": "application/json"}
    )

    assert response.status_code == 422
    assert response.get_json()["error"]["message"].startswith("the request body: ")


def test_a_webhook_url_with_a_percent_encoded_path_and_query_is_accepted_as_sent(client):
    url = "http://127.0.0.1:9/caf%C3%A9/hook?job=a%20b&x=1#top"

    response = post_job(client, {**VALID, "webhook_url": url})

    assert response.status_code == 202, response.text
    assert response.get_json()["webhook"]["url"] == url


def test_a_body_over_the_size_limit_gets_413(client):
    response = post_job(client, {**VALID, "prompt": "x" * (2 * 1024 * 1024)})

    assert response.status_code == 413
    assert response.get_json()["error"]["code"] == "payload_too_large"


def test_a_valid_job_with_every_field_is_accepted(client):
    body = {
        # width 256: the most that 8 images of 200 steps may have within the CPU cost limits (api/limits.py)
        "prompt": "a red fox",
        "negative_prompt": "blurry",
        "height": P.MIN_SIZE,
        "width": 256,
        "num_inference_steps": P.MAX_STEPS,
        "guidance_scale": P.MAX_GUIDANCE,
        "seed": P.MAX_SEED - (P.MAX_NUM_IMAGES - 1),
        "sampler": "dpmpp_2m",  # the last of the sd family's samplers
        "num_images": P.MAX_NUM_IMAGES,
        "model": "builtin:tiny",
        "num_frames": 1,
        "lora_scale": -P.MAX_LORA_SCALE,
        "webhook_url": HOOK,  # `lora` needs a store: tests/api/test_loras.py
        "webhook_events": ["completed", "failed"],
        "deadline": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
    }

    response = post_job(client, body)

    assert response.status_code == 202, response.text
    job = response.get_json()
    assert {k: job["params"][k] for k in body if k in job["params"]} == {
        k: v for k, v in body.items() if k in job["params"]
    }
    assert job["webhook"] == {"url": HOOK, "events": ["completed", "failed"], "attempts": []}
    assert job["deadline"] is not None


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("DELETE", "/v1/jobs"),
        ("PUT", "/v1/jobs/x"),
        ("GET", "/v1/jobs/x/cancel"),
        ("GET", "/nowhere"),
        ("POST", "/healthz"),
    ],
)
def test_unknown_routes_and_methods_answer_in_the_json_error_shape(client, method, path):
    response = client.open(path, method=method, headers=auth())

    assert response.status_code in (404, 405)
    assert response.headers["Content-Type"].startswith("application/json")
    assert set(response.get_json()["error"]) >= {"code", "message"}


def test_the_openapi_document_names_the_cache_presets_and_the_threshold_range(client):
    schema = client.get("/openapi.json").get_json()["components"]["schemas"]
    cache = next(model["properties"]["cache"] for model in schema.values() if "cache" in model.get("properties", {}))

    forms = cache["anyOf"]
    assert {"off", *step_cache.PRESET_NAMES} <= set(next(form["enum"] for form in forms if "enum" in form))
    assert any(form.get("type") == "number" and form.get("maximum") == step_cache.MAX_THRESHOLD for form in forms)
