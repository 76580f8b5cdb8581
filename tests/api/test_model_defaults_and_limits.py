"""In process (Flask test client, real Redis): a job that names no model gets the served model, per-model
cost limits refuse oversized jobs before anything is stored, and a canceled job always says so."""

from __future__ import annotations

import pytest

from api import create_app
from api.limits import CPU_LIMITS, GPU_LIMITS, LimitTable, ModelLimits
from api.settings import ApiSettings, read_limits
from storage.job_store import JobState, JobStore
from storage.settings import StorageSettings
from tests.support.job_factories import take_job

KEY = "sk_first_hour_test_key_0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def make_app(redis_url, tmp_path):
    def make(**overrides):
        settings = ApiSettings(
            api_keys=(("local", KEY),),
            storage=StorageSettings(redis_url=redis_url, storage_url=tmp_path.as_uri()),
            **{"accept_unserved_models": True, **overrides},
        )  # no worker here: jobs stay queued
        return create_app({"API_SETTINGS": settings, "TESTING": True})

    return make


def store_of(app) -> JobStore:
    return app.extensions["stepwise.job_store"]


def test_a_job_that_names_no_model_gets_the_model_the_service_serves(make_app):
    client = make_app(default_model="builtin:small").test_client()

    unnamed = client.post("/v1/jobs", json={"prompt": "a fox", "num_inference_steps": 2}, headers=AUTH)
    named = client.post("/v1/jobs", json={"prompt": "a fox", "model": "builtin:tiny"}, headers=AUTH)

    assert unnamed.status_code == 202, unnamed.json
    assert unnamed.json["params"]["model"] == "builtin:small"
    assert named.json["params"]["model"] == "builtin:tiny"
    document = client.get("/openapi.json").json
    assert document["components"]["schemas"]["JobRequest"]["properties"]["model"]["default"] == "builtin:small"


def test_stepwise_model_sets_the_apis_default_model_as_it_sets_the_workers(monkeypatch):
    from worker.settings import WorkerSettings

    monkeypatch.setenv("STEPWISE_API_KEYS", f"local:{KEY}")
    monkeypatch.setenv("STEPWISE_MODEL", "/models/stable-diffusion-v1-5")

    assert ApiSettings.from_env().default_model == "/models/stable-diffusion-v1-5"
    assert WorkerSettings.from_env().model == "/models/stable-diffusion-v1-5"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"height": 2048, "width": 2048, "num_images": 8, "num_inference_steps": 200}, "height"),
        ({"height": 512, "width": 512, "num_images": 8, "num_inference_steps": 50}, "num_images"),
        ({"height": 512, "width": 512, "num_inference_steps": 200}, "num_inference_steps"),
    ],
)
def test_a_job_over_its_models_cpu_limits_gets_422_naming_the_field_and_is_not_stored(make_app, body, field):
    app = make_app(limits=LimitTable(device="cpu"))

    response = app.test_client().post("/v1/jobs", json={"prompt": "too much", **body}, headers=AUTH)

    assert response.status_code == 422, response.json
    assert response.json["error"]["code"] == "limit_exceeded"
    assert response.json["error"]["field"] == field
    assert store_of(app).queue_depth() == 0


def test_a_batch_item_over_the_limits_is_refused_alone(make_app):
    app = make_app(limits=LimitTable(device="cpu"))
    jobs = [{"prompt": "small", "num_inference_steps": 2}, {"prompt": "huge", "height": 1024, "width": 1024}]

    response = app.test_client().post("/v1/jobs/batch", json={"jobs": jobs}, headers=AUTH)

    assert [item["status"] for item in response.json["results"]] == [202, 422]
    assert response.json["results"][1]["error"]["field"] == "jobs[1].height"


def test_limits_default_to_the_device_and_the_operator_overrides_them_per_model(monkeypatch):
    monkeypatch.setenv("STEPWISE_DEVICE", "cuda")
    monkeypatch.setenv("STEPWISE_MODEL_LIMITS", '{"/models/sdxl": {"max_pixels": 1048576}}')
    monkeypatch.setenv("STEPWISE_MAX_PIXEL_STEPS", "1000000")
    table = read_limits()

    assert LimitTable(device="cpu").for_model("/models/sd") == CPU_LIMITS
    assert LimitTable(device="auto").for_model("builtin:tiny") == CPU_LIMITS
    assert LimitTable(device="cuda:1").for_model("/models/sd") == GPU_LIMITS
    assert table.for_model("/models/sdxl") == ModelLimits(max_pixels=1048576, max_pixel_steps=1000000)
    assert table.for_model("/models/sd") == ModelLimits(max_pixels=GPU_LIMITS.max_pixels, max_pixel_steps=1000000)


def test_a_null_per_model_limit_keeps_the_default_instead_of_breaking_every_job_of_that_model(monkeypatch):
    monkeypatch.setenv("STEPWISE_DEVICE", "cuda")
    monkeypatch.setenv("STEPWISE_MODEL_LIMITS", '{"/models/sdxl": {"max_pixels": null, "max_pixel_steps": 5000000}}')

    assert read_limits().for_model("/models/sdxl") == ModelLimits(
        max_pixels=GPU_LIMITS.max_pixels, max_pixel_steps=5000000
    )


def test_the_first_hour_oversized_job_is_refused_but_the_tour_jobs_fit_the_cpu_limits():
    from core.params import GenerationParams

    cpu = LimitTable(device="cpu")
    tour = GenerationParams(prompt="a red fox", seed=7, num_inference_steps=40, num_images=2)
    cpu.check(tour)  # does not raise
    with pytest.raises(Exception, match="over the limit"):
        cpu.check(GenerationParams(prompt="x", height=2048, width=2048, num_images=8, num_inference_steps=200))


def test_every_canceled_job_view_carries_an_error_object(make_app):
    app = make_app()
    client = app.test_client()
    running = client.post("/v1/jobs", json={"prompt": "stop me later"}, headers=AUTH).json
    queued = client.post("/v1/jobs", json={"prompt": "stop me"}, headers=AUTH).json
    store = store_of(app)
    holder = take_job(store, running["job_id"], "worker-1").holder
    store.request_cancel(running["job_id"])
    store.finish(running["job_id"], JobState.CANCELED, holder=holder)  # a worker that gives no reason

    canceled_queued = client.post(f"/v1/jobs/{queued['job_id']}/cancel", headers=AUTH).json
    canceled_running = client.get(f"/v1/jobs/{running['job_id']}", headers=AUTH).json

    for view in (canceled_queued, canceled_running):
        assert view["state"] == "canceled"
        assert view["error"]["code"] == "canceled" and view["error"]["message"]


def test_an_img2img_job_is_priced_at_the_steps_its_strength_runs():
    from core.params import GenerationParams
    from tests.support.pictures import data_uri, image_bytes

    table = LimitTable(overrides=ModelLimits(max_pixels=64 * 64, max_pixel_steps=64 * 64 * 10))
    picture = data_uri(image_bytes(64, 64))
    job = dict(prompt="a fox", seed=1, height=64, width=64, num_inference_steps=20)

    table.check(GenerationParams(**job, init_image=picture, strength=0.5))  # runs 10 of its 20 steps: fits
    for over in (GenerationParams(**job), GenerationParams(**job, init_image=picture, strength=0.6)):  # 20, 12
        with pytest.raises(Exception, match="over the limit"):
            table.check(over)
