"""LoRA adapters end to end over real HTTP: `stepwise api` and a Celery worker (builtin:tiny) sharing a
file:// adapter store; an operator adapter and a tenant upload both shape their jobs' images."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save

from benchmarks.random_loras import make_lora
from tests.support.calls import auth, submit, wait_for_job
from tests.support.processes import ApiProcess, WorkerProcess

pytestmark = pytest.mark.workers

JOB = {"prompt": "a red fox in snow", "seed": 7, "num_inference_steps": 4, "height": 64, "width": 64}


@pytest.fixture(scope="module")
def lora_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora-store")
    make_lora("builtin:tiny", folder / "house-style.safetensors", seed=1)
    (folder / "wrong-model.safetensors").write_bytes(
        save(
            {
                "unet.mid_block.attentions.0.proj_in.lora_A.weight": torch.zeros(4, 5),
                "unet.mid_block.attentions.0.proj_in.lora_B.weight": torch.zeros(5, 4),
            }
        )
    )
    return folder


@pytest.fixture(scope="module")
def lora_service(module_redis, storage_url, lora_folder, tmp_path_factory):
    lora_url = lora_folder.as_uri()
    api = ApiProcess(
        tmp_path_factory.mktemp("api"),
        module_redis.url,
        storage_url,
        STEPWISE_LORA_URL=lora_url,
        STEPWISE_LORA_MAX_BYTES="2000000",
    ).start()
    worker = WorkerProcess(
        tmp_path_factory.mktemp("worker"), module_redis.url, storage_url, STEPWISE_LORA_URL=lora_url
    ).start()
    yield api
    worker.stop()
    api.stop()


def image_of(http, api, job: dict, tenant: str) -> np.ndarray:
    done = wait_for_job(http, api, job["job_id"], {"succeeded"}, tenant=tenant)
    response = http.get(done["image_url"], headers=auth(tenant), timeout=30)
    return np.asarray(Image.open(io.BytesIO(response.content)).convert("RGB")).astype(np.int16)


def test_operator_and_uploaded_adapters_work_and_stay_with_their_tenant(lora_service, http, tmp_path):
    api = lora_service
    upload = make_lora("builtin:tiny", tmp_path / "mine.safetensors", seed=2).read_bytes()
    put = http.put(f"{api.url}/v1/loras/mine", data=upload, headers=auth("alice"), timeout=30)
    assert put.status_code == 201, put.text

    jobs = {
        "plain": (submit(http, api, JOB, tenant="bob").json(), "bob"),
        "house": (submit(http, api, {**JOB, "lora": "house-style"}, tenant="bob").json(), "bob"),
        "mine": (submit(http, api, {**JOB, "lora": "mine", "lora_scale": 0.8}).json(), "alice"),
    }
    refused = submit(http, api, {**JOB, "lora": "mine"}, tenant="bob")
    unfit = submit(http, api, {**JOB, "lora": "wrong-model"}).json()
    images = {name: image_of(http, api, job, tenant) for name, (job, tenant) in jobs.items()}

    assert refused.status_code == 422 and "'mine' does not exist" in refused.json()["error"]["message"]
    assert "mine" not in [
        item["name"] for item in http.get(f"{api.url}/v1/loras", headers=auth("bob"), timeout=10).json()["loras"]
    ]
    # Co-batching moves a pixel by at most 1 level: a larger change is the adapter's.
    assert np.abs(images["house"] - images["plain"]).max() > 3
    assert np.abs(images["mine"] - images["plain"]).max() > 3
    failed = wait_for_job(http, api, unfit["job_id"], {"failed"})
    assert "'wrong-model' does not fit" in failed["error"]["message"]
    assert wait_for_job(http, api, submit(http, api, JOB).json()["job_id"], {"succeeded"})  # the worker goes on
