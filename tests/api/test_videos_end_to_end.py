"""Videos end to end over real HTTP: `stepwise api`, a real Celery worker serving builtin:tiny-wan, real Redis and
local storage. The MP4 a client downloads is decoded with PyAV (FFmpeg), as a player would read it."""

from __future__ import annotations

import io
import subprocess
import sys
import warnings
from pathlib import Path

import av
import openai
import pytest
from PIL import Image

from tests.support.calls import auth, submit, wait_for_job
from tests.support.pictures import png_data_uri
from tests.support.processes import TENANT_KEYS, WorkerProcess
from tests.support.servers import child_env
from tests.support.waiting import wait_for

CHEAP = {"model": "builtin:tiny-wan", "num_inference_steps": 2, "guidance_scale": 1.0}


@pytest.fixture(scope="module")
def wan_worker(module_redis, storage_url, tmp_path_factory, api):
    process = WorkerProcess(
        tmp_path_factory.mktemp("wan-worker"), module_redis.url, storage_url, STEPWISE_MODEL="builtin:tiny-wan"
    ).start()
    yield process
    process.stop()


@pytest.fixture
def client(api, wan_worker):
    with warnings.catch_warnings():  # the SDK marks its video methods deprecated (OpenAI's own service ends)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield openai.OpenAI(api_key=TENANT_KEYS["alice"], base_url=f"{api.url}/v1", max_retries=0, timeout=60)


def decoded(data: bytes) -> tuple[int, tuple[int, int], float]:
    """(frames, (width, height), frames per second) of a video file, as FFmpeg reads it."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [frame.to_image() for frame in container.decode(stream)]
        return len(frames), frames[0].size, float(stream.average_rate)


def test_a_video_job_is_served_as_an_mp4_of_the_frames_size_and_fps_it_asked_for(api, wan_worker, http):
    body = {**CHEAP, "prompt": "a red fox running", "seed": 3, "num_frames": 9, "height": 64, "width": 96, "fps": 8}
    response = submit(http, api, body)
    assert response.status_code == 202, response.text
    assert response.json()["params"]["output_format"] == "mp4"  # the default for a video model
    job = wait_for_job(http, api, response.json()["job_id"], {"succeeded"})

    video = http.get(job["image_url"], headers=auth(), timeout=10)

    assert video.headers["Content-Type"] == "video/mp4"
    assert decoded(video.content) == (9, (96, 64), 8.0)
    models = http.get(f"{api.url}/v1/models", headers=auth(), timeout=10).json()["models"]
    wan = next(model for model in models if model["model"] == "builtin:tiny-wan")
    assert {name: wan["defaults"][name] for name in ("num_frames", "fps", "output_format")} == {
        "num_frames": 33,
        "fps": 16,
        "output_format": "mp4",
    }
    assert (wan["limits"]["max_num_frames"], wan["limits"]["frames_per_latent"]) == (161, 4)


def test_the_openai_client_creates_polls_downloads_lists_and_deletes_a_video_that_other_tenants_cannot_see(
    client, api, http
):
    created = client.videos.create(
        model="builtin:tiny-wan",
        prompt="a lighthouse at dusk",
        size="64x64",  # type: ignore[arg-type]  # the SDK's Literal lists OpenAI's sizes
        seconds="0.5",  # type: ignore[arg-type]  # 0.5 s at 16 fps: 8 frames after the first
        extra_body={"num_inference_steps": 2, "guidance_scale": 1.0, "seed": 5},
    )
    assert (created.status, created.size, created.seconds, created.model) == (
        "queued",
        "64x64",
        "0.5",
        "builtin:tiny-wan",
    )

    done = wait_for(lambda: (v := client.videos.retrieve(created.id)).status == "completed" and v, 120, "completed")
    content = client.videos.download_content(created.id).read()

    assert (done.progress, done.completed_at is not None) == (100, True)
    assert decoded(content) == (9, (64, 64), 16.0)
    assert created.id in [video.id for video in client.videos.list()]
    assert "builtin:tiny-wan" in [model.id for model in client.models.list()]  # GET /v1/models in OpenAI's shape
    bob = auth("bob")
    for method, path in [("GET", ""), ("GET", "/content"), ("DELETE", "")]:
        response = http.request(method, f"{api.url}/v1/videos/{created.id}{path}", headers=bob, timeout=10)
        assert response.status_code == 404, (method, path, response.text)
    assert http.get(f"{api.url}/v1/videos", headers=bob, timeout=10).json()["data"] == []

    deleted = client.videos.delete(created.id)

    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(created.id)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"num_frames": 8}, "num_frames"),  # Wan: 4k+1
        ({"fps": 0}, "fps"),
        ({"seconds": "60"}, "seconds"),  # over the family's 161 frames
        ({"size": "72x64"}, "size"),  # not a multiple of 16
        ({"model": "builtin:tiny"}, "model"),  # an image model
        ({"loop": True}, "loop"),
        ({"input_reference": png_data_uri(Image.new("RGB", (96, 64), "red"))}, "input_reference"),  # text-to-video
    ],
    ids=str,
)
def test_an_invalid_video_request_gets_a_400_naming_the_field(api, wan_worker, http, fields, param):
    body = {"prompt": "a fox", "model": "builtin:tiny-wan", **fields}

    response = http.post(f"{api.url}/v1/videos", json=body, headers=auth(), timeout=10)

    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_fields_its_model_cannot_use_are_refused_at_submit_naming_them(api, wan_worker, http):
    """The worker reports the family's model fields its model lacks (a family rule cannot tell: it is text-to-video
    with one expert), so the API refuses the job instead of the worker failing it."""
    image = png_data_uri(Image.new("RGB", (96, 64), "red"))

    first_frame = submit(http, api, {**CHEAP, "prompt": "a fox", "init_image": image, "height": 64, "width": 96})
    second_guidance = submit(http, api, {**CHEAP, "prompt": "a fox", "guidance_scale_2": 3.0})

    assert first_frame.status_code == 422, first_frame.text
    assert first_frame.json()["error"]["field"] == "init_image"
    assert "only image-to-video models" in first_frame.json()["error"]["message"]
    assert second_guidance.status_code == 422, second_guidance.text
    assert second_guidance.json()["error"]["field"] == "guidance_scale_2"
    assert "only two-expert models" in second_guidance.json()["error"]["message"]


def test_the_docs_python_video_example_runs_as_written_and_prints_no_warning(api, wan_worker, tmp_path):
    text = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    section = text[text.index("## Videos") :]
    start = section.index("```python") + len("```python")
    example = section[start : section.index("```", start)]

    result = subprocess.run(  # as a user runs it: a script of its own, so Python shows DeprecationWarnings
        [sys.executable, "-"],
        input=example,
        cwd=tmp_path,
        env=child_env(STEPWISE_API_URL=api.url, STEPWISE_API_KEY=TENANT_KEYS["alice"]),
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("saved clip.mp4\n", "")
    assert decoded((tmp_path / "clip.mp4").read_bytes()) == (9, (64, 64), 16.0)
