"""Several images through the OpenAI edits route end to end: the official `openai` client sends a list of images
(multipart `image[]`) to `stepwise api` over real HTTP; a real Celery worker serving builtin:tiny-flux2 reads them
as FLUX.2's reference images (real Redis, local storage)."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from tests.support.calls import auth
from tests.support.pictures import init_picture
from tests.support.processes import TENANT_KEYS, ApiProcess, WorkerProcess
from tests.support.waiting import wait_for

pytestmark = pytest.mark.workers

MODEL = "builtin:tiny-flux2"


@pytest.fixture(scope="module")
def flux2_api(module_redis, storage_url, tmp_path_factory):
    server = ApiProcess(
        tmp_path_factory.mktemp("flux2-api"),
        module_redis.url,
        storage_url,
        STEPWISE_ACCEPT_UNSERVED_MODELS="false",
        STEPWISE_IMAGES_WAIT_SECONDS="120",
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def flux2_worker(module_redis, storage_url, tmp_path_factory, flux2_api):
    process = WorkerProcess(
        tmp_path_factory.mktemp("flux2-worker"), module_redis.url, storage_url, STEPWISE_MODEL=MODEL
    ).start()

    def served() -> bool:
        models = httpx.get(f"{flux2_api.url}/v1/models", headers=auth(), timeout=10).json()["models"]
        return any(model["model"] == MODEL and model["available"] for model in models)

    wait_for(served, 120, lambda: "the API to see the FLUX.2 worker", interval=0.2)
    yield process
    process.stop()


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def decoded(item) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(item.b64_json))).convert("RGB"), dtype=np.int16)


def test_the_openai_client_edits_with_two_images_as_reference_images(flux2_api, flux2_worker):
    client = openai.OpenAI(api_key=TENANT_KEYS["alice"], base_url=f"{flux2_api.url}/v1", max_retries=0, timeout=180)
    first = init_picture(80).resize((80, 72))  # cropped to 80x64 by the pipeline's rule
    second = Image.new("RGB", (64, 64), (240, 200, 20))
    options = {"model": MODEL, "prompt": "the fox in the room", "extra_body": {"num_inference_steps": 3, "seed": 4}}

    both = client.images.edit(
        image=[("a.png", png(first), "image/png"), ("b.png", png(second), "image/png")], **options
    )
    one = client.images.edit(image=("a.png", png(first), "image/png"), **options)

    assert both.size == one.size == "80x64", "the first image sets the size, as Flux2Pipeline's does"
    assert np.abs(decoded(both.data[0]) - decoded(one.data[0])).max() > 3, "the second image changes the picture"


def test_several_images_for_a_model_that_takes_no_list_are_refused_naming_the_image(flux2_api):
    client = openai.OpenAI(api_key=TENANT_KEYS["alice"], base_url=f"{flux2_api.url}/v1", max_retries=0)
    picture = ("a.png", png(init_picture(64)), "image/png")

    with pytest.raises(openai.BadRequestError) as refused:
        client.images.edit(model="builtin:tiny", image=[picture, picture], prompt="a fox")

    assert refused.value.body["param"] == "image[0]"
    assert "reference_images" in refused.value.body["message"]
