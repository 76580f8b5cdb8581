"""With S3 storage (moto's server over HTTP), image URLs are presigned and the image route redirects."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from tests.support.calls import auth, submit, wait_for_job
from tests.support.processes import ApiProcess, WorkerProcess
from tests.support.servers import RedisServer, s3_env

pytestmark = pytest.mark.workers


def test_with_s3_storage_the_image_url_is_presigned_and_the_image_route_redirects(s3_server, s3_bucket, tmp_path, http):
    env = s3_env(s3_server.endpoint_url, s3_bucket)
    storage_url = env.pop("STEPWISE_STORAGE_URL")
    redis = RedisServer(tmp_path / "redis", appendonly=False).start()
    api = worker = None
    try:
        api = ApiProcess(tmp_path / "api", redis.url, storage_url, **env).start()
        worker = WorkerProcess(tmp_path / "worker", redis.url, storage_url, **env).start()
        job = submit(
            http, api, {"prompt": "a cloud", "seed": 2, "num_inference_steps": 2, "height": 64, "width": 64}
        ).json()

        done = wait_for_job(http, api, job["job_id"], {"succeeded"})
        redirect = http.get(f"{done['status_url']}/image", headers=auth(), allow_redirects=False, timeout=10)
        image = http.get(done["image_url"], timeout=10)  # presigned: no API key needed
        ready = http.get(f"{api.url}/readyz", timeout=10).json()

        assert done["image_url"].startswith(f"{s3_server.endpoint_url}/{s3_bucket}/")
        assert "Signature" in done["image_url"]
        assert redirect.status_code == 302
        assert redirect.headers["Location"].split("?")[0] == done["image_url"].split("?")[0]
        assert image.status_code == 200
        with Image.open(io.BytesIO(image.content)) as png:
            assert png.format == "PNG" and png.size == (64, 64)
        assert ready["checks"] == {"redis": True, "storage": True}
    finally:
        for process in (worker, api):
            if process is not None:
                process.stop()
        redis.stop()
