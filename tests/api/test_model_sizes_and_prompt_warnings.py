"""In process (Flask test client, real Redis): GET /v1/models offers each model's trained or recommended sizes, and
a prompt outside a trained built-in's vocabulary is accepted with a warning in the job view."""

from __future__ import annotations

import math
import time

import pytest

from api import create_app
from api.limits import LimitTable
from api.settings import ApiSettings
from storage.heartbeats import Heartbeat
from storage.queue_names import generate_queue
from storage.settings import StorageSettings

KEY = "sk_sizes_and_warnings_test_key_0123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def client(redis_url, tmp_path):
    settings = ApiSettings(
        api_keys=(("local", KEY),),
        storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()),
        accept_unserved_models=True,  # no worker here: jobs stay queued
    )
    return create_app({"API_SETTINGS": settings, "TESTING": True}).test_client()


def beat(client, model: str, family: str) -> None:
    """What a worker serving `model` writes every few seconds (worker.heartbeat)."""
    store = client.application.extensions["stepwise.job_store"]
    store.beat(Heartbeat(f"worker-{model}", model, generate_queue(model), family, capacity=4, seen_at=time.time()))


def test_the_models_list_offers_each_models_trained_or_recommended_sizes(client):
    for model, family in [
        ("builtin:shapes", "sd"),
        ("builtin:shapes-dit", "zimage"),
        ("builtin:tiny", "sd"),
        ("/models/sdxl-base", "sdxl"),
    ]:
        beat(client, model, family)

    response = client.get("/v1/models", headers=AUTH)

    sizes = {entry["model"]: entry["sizes"] for entry in response.json["models"]}
    assert sizes == {
        "builtin:shapes": [128],  # what it was trained at: 192 and 256 draw nothing it knows
        "builtin:shapes-dit": [128, 112, 96],
        "builtin:tiny": [128],  # random weights: its family's default
        "/models/sdxl-base": [1024],  # a checkpoint: its family's trained size
    }


@pytest.mark.parametrize("model", ["builtin:shapes", "builtin:shapes-dit"])
def test_a_prompt_outside_the_shapes_grammar_is_accepted_and_its_job_says_the_model_does_not_know_it(client, model):
    response = client.post("/v1/jobs", json={"prompt": "a watercolor of a fox", "model": model}, headers=AUTH)

    assert response.status_code == 202, response.json
    (warning,) = response.json["warnings"]
    assert f"outside what {model} knows" in warning and "a <colour> <shape> on a <colour> background" in warning
    assert "purple" in warning and "triangle" in warning  # the words it does know
    assert client.get(f"/v1/jobs/{response.json['job_id']}", headers=AUTH).json["warnings"] == [warning]


@pytest.mark.parametrize(
    ("model", "prompt"),
    [
        ("builtin:shapes", "a yellow triangle on a purple background"),
        ("builtin:shapes-dit", "A Red circle on a blue background."),
        ("builtin:tiny", "a watercolor of a fox"),  # random weights know nothing, so nothing is outside
    ],
)
def test_a_prompt_the_model_knows_or_any_prompt_of_other_models_has_no_warning(client, model, prompt):
    response = client.post("/v1/jobs", json={"prompt": prompt, "model": model}, headers=AUTH)

    assert response.status_code == 202, response.json
    assert response.json["warnings"] == []


@pytest.mark.parametrize(
    ("model", "model_limits"),
    [
        ("builtin:shapes", ""),  # the CPU defaults: 512 x 512
        ("builtin:shapes-dit", '{"builtin:shapes-dit": {"max_pixels": 16384, "max_pixel_steps": 819200}}'),
    ],
)
def test_the_limits_the_models_list_advertises_are_the_ones_a_job_is_checked_against(
    redis_url, tmp_path, model, model_limits
):
    settings = ApiSettings(
        api_keys=(("local", KEY),),
        storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()),
        limits=LimitTable.configured(device="cpu", max_pixels=None, max_pixel_steps=None, model_limits=model_limits),
        accept_unserved_models=True,
    )
    client = create_app({"API_SETTINGS": settings, "TESTING": True}).test_client()
    beat(client, model, "sd" if model == "builtin:shapes" else "zimage")
    (entry,) = client.get("/v1/models", headers=AUTH).json["models"]
    max_pixels, max_pixel_steps = entry["limits"]["max_pixels"], entry["limits"]["max_pixel_steps"]
    side = math.isqrt(max_pixels)  # both cases' limits are squares of a multiple of 16
    steps = max_pixel_steps // max_pixels

    def submit(width: int, num_inference_steps: int = 1):
        body = {"prompt": "a red circle on a blue background", "model": model, "height": side, "width": width}
        return client.post("/v1/jobs", json={**body, "num_inference_steps": num_inference_steps}, headers=AUTH)

    assert submit(side).status_code == 202 and submit(side, steps).status_code == 202
    too_wide, too_long = submit(side + 16), submit(side, steps + 1)
    assert too_wide.status_code == 422 and too_wide.json["error"]["field"] == "height"
    assert f"over the limit of {max_pixels} pixels" in too_wide.json["error"]["message"]
    assert too_long.status_code == 422 and f"over the limit of {max_pixel_steps}" in too_long.json["error"]["message"]


def test_the_models_list_is_also_in_openais_list_shape(client):
    beat(client, "builtin:shapes", "sd")

    listed = client.get("/v1/models", headers=AUTH).json

    assert listed["object"] == "list"
    (model,) = listed["data"]
    assert model["id"] == "builtin:shapes" and model["object"] == "model" and model["owned_by"] == "stepwise"
    assert abs(model["created"] - time.time()) < 60
    assert [entry["model"] for entry in listed["models"]] == ["builtin:shapes"]  # our own fields stay
