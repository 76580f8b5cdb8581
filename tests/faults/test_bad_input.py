"""Bad input is refused at the boundary, before anything is allocated, and never answers 5xx.

Also covered elsewhere, not repeated here:
- `tests/api/test_openapi_fuzz.py`: property-based requests to every route from the OpenAPI
  document (valid and invalid) get no 5xx and only documented answers;
- `tests/api/test_validation.py`: each engine rule (sizes, steps, NUL in prompts, ...) gives 422
  naming the field, and a body over the limit gives 413;
- `tests/api/test_limits.py`: the body limit is configurable.
"""

from __future__ import annotations

import dataclasses
import io

import pytest
from PIL import Image

from batching import DiffusionEngine, EngineConfig, GenerationParams
from core import params as P
from core.errors import InvalidParamsError
from tests.support.calls import auth, get_job, submit
from tests.support.processes import ApiProcess
from tests.support.servers import RedisServer

pytestmark = pytest.mark.timeout(300)

VALID = {"prompt": "a red fox", "seed": 1, "num_inference_steps": 2, "height": 64, "width": 64, "guidance_scale": 1.0}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """`stepwise api` with no worker: accepted jobs stay queued."""
    root = tmp_path_factory.mktemp("bad-input")
    redis = RedisServer(root / "redis", appendonly=False).start()
    server = ApiProcess(root, redis.url, (root / "images").as_uri()).start()
    yield server
    server.stop()
    redis.stop()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("height", 10**9),
        ("width", 2**63),
        ("height", -(2**70)),
        ("num_inference_steps", 10**12),
        ("num_images", 10**6),
        ("guidance_scale", 1e308),
        ("seed", 2**200),
    ],
    ids=str,
)
@pytest.mark.e2e
def test_absurd_sizes_and_counts_get_422_naming_the_field(api, http, field, value):
    response = submit(http, api, {**VALID, field: value})

    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


@pytest.mark.e2e
def test_the_largest_seed_with_several_images_is_refused_rather_than_overflowing(api, http):
    response = submit(http, api, {**VALID, "seed": P.MAX_SEED, "num_images": 2})

    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "seed"


@pytest.mark.e2e
def test_a_prompt_of_megabytes_gets_413_and_one_under_the_body_limit_gets_422(api, http):
    huge = submit(http, api, {**VALID, "prompt": "fox " * 1_000_000})
    long = submit(http, api, {**VALID, "prompt": "fox " * 100_000})

    assert huge.status_code == 413 and huge.json()["error"]["code"] == "payload_too_large"
    assert long.status_code == 422 and long.json()["error"]["field"] == "prompt"
    listed = http.get(f"{api.url}/v1/jobs", headers=auth(), timeout=10).json()["jobs"]
    assert all(len(job["params"]["prompt"]) <= P.MAX_PROMPT_CHARS for job in listed)


@pytest.mark.parametrize(
    "prompt",
    [
        "a fox \U0001f98a in the snow ❄️",
        "雪の中の赤い狐",
        "紅色狐狸",
        "🦊" * 500,
        "e\u0301\u200d\u202eright to left",
        "tab\tand\nnewline\r\n",
        "bell \x07 and escape \x1b[31m",
        "\ufeffbyte order mark",
        "\U0010ffff",
    ],
    ids=repr,
)
@pytest.mark.e2e
def test_unicode_and_control_characters_are_accepted_and_kept_exactly(api, http, prompt):
    response = submit(http, api, {**VALID, "prompt": prompt})

    assert response.status_code == 202, response.text
    assert get_job(http, api, response.json()["job_id"]).json()["params"]["prompt"] == prompt


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt": "lone \\ud800 surrogate"}',
        b'{"prompt": "nul \\u0000 inside"}',
        b'{"prompt": "fox", "negative_prompt": "\\udfff"}',
    ],
    ids=repr,
)
@pytest.mark.e2e
def test_a_prompt_that_is_not_text_gets_422_naming_it(api, http, raw):
    response = http.post(
        f"{api.url}/v1/jobs", data=raw, timeout=10, headers={**auth(), "Content-Type": "application/json"}
    )

    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] in ("prompt", "negative_prompt")


def test_the_engine_refuses_absurd_params_before_allocating_anything():
    with pytest.raises(InvalidParamsError, match="height"):
        GenerationParams(prompt="x", height=10**9)
    with pytest.raises(InvalidParamsError, match="num_inference_steps"):
        GenerationParams(prompt="x", num_inference_steps=10**12)

    engine = DiffusionEngine(EngineConfig(model="builtin:tiny", max_num_seqs=2, device="cpu"))
    try:
        forged = GenerationParams(prompt="x", height=64, width=64)
        object.__setattr__(forged, "width", 2**20)  # altered after validation
        with pytest.raises(InvalidParamsError, match="width"):
            engine.submit(forged)
        stats = engine.stats()
        assert stats["num_waiting"] == stats["num_running"] == 0 and stats["iterations"] == 0
        result = engine.submit(dataclasses.replace(forged, width=64, num_inference_steps=1)).result(timeout=120)
        assert result.images[0].size == (64, 64)  # the engine serves the next job normally
    finally:
        engine.shutdown()


@pytest.mark.workers
def test_an_emoji_and_cjk_prompt_generates_an_image_end_to_end(folder_cluster, tmp_path, http):
    folder_cluster.start_worker()
    api = ApiProcess(tmp_path / "api", folder_cluster.redis.url, folder_cluster.images.resolve().as_uri()).start()
    try:
        job = submit(http, api, {**VALID, "prompt": "雪の中の狐 🦊❄️ 紅色狐狸"}).json()
        record = folder_cluster.wait_for_end(job["job_id"])
        image = http.get(f"{api.url}/v1/jobs/{job['job_id']}/image", headers=auth(), timeout=10)
    finally:
        api.stop()

    assert record.state.value == "succeeded", record.error_message
    assert Image.open(io.BytesIO(image.content)).size == (64, 64)
