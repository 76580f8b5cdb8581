"""LoRA adapters through the API (in-process Flask app on real Redis): tenant uploads, listing, isolation,
and jobs naming adapters refused at submit when the tenant cannot use them."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save

from api import create_app
from api.settings import ApiSettings
from storage.settings import StorageSettings
from tests.api.calls import auth
from tests.api.processes import TENANT_KEYS

MAX_LORA_BYTES = 4096
TRUNCATED_HEADER = b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'


def lora_bytes(rank: int = 2) -> bytes:
    """A small, valid safetensors file with LoRA-style keys (the API checks the format, not the weights)."""
    return save(
        {
            "unet.mid_block.attentions.0.proj_in.lora_A.weight": np.ones((rank, 8), dtype=np.float32),
            "unet.mid_block.attentions.0.proj_in.lora_B.weight": np.zeros((8, rank), dtype=np.float32),
        }
    )


@pytest.fixture
def lora_folder(tmp_path):
    folder = tmp_path / "loras"
    folder.mkdir()
    (folder / "house-style.safetensors").write_bytes(lora_bytes())
    return folder


@pytest.fixture
def lora_client(redis_url, tmp_path, lora_folder):
    settings = ApiSettings(
        api_keys=tuple(TENANT_KEYS.items()),
        storage=StorageSettings(
            redis_url=redis_url,
            storage_url=(tmp_path / "images").as_uri(),
            lora_url=lora_folder.as_uri(),
            lora_max_bytes=MAX_LORA_BYTES,
        ),
        accept_unserved_models=True,  # no worker here: jobs stay queued
    )
    return create_app({"TESTING": True, "STEPWISE_SETTINGS": settings}).test_client()


def put_lora(client, name: str, body: bytes, tenant: str = "alice"):
    headers = {**auth(tenant), "Content-Type": "application/octet-stream"}
    return client.put(f"/v1/loras/{name}", data=body, headers=headers)


def submit(client, tenant: str = "alice", **fields):
    return client.post("/v1/jobs", json={"prompt": "a fox", **fields}, headers=auth(tenant))


def test_a_tenant_uploads_lists_and_uses_its_own_adapter(lora_client, lora_folder):
    created = put_lora(lora_client, "my-style", lora_bytes())
    assert created.status_code == 201, created.json
    assert created.json == {"name": "my-style", "size_bytes": len(lora_bytes()), "owner": "tenant"}

    listed = lora_client.get("/v1/loras", headers=auth("alice")).json["loras"]
    assert {(item["name"], item["owner"]) for item in listed} == {("my-style", "tenant"), ("house-style", "operator")}
    assert lora_client.get("/v1/loras/my-style", headers=auth("alice")).status_code == 200
    assert submit(lora_client, lora="my-style", lora_scale=0.8).status_code == 202
    assert submit(lora_client, lora="house-style").status_code == 202
    assert put_lora(lora_client, "my-style", lora_bytes(rank=3)).status_code == 200  # replaced


def test_another_tenant_can_neither_see_nor_use_an_upload(lora_client):
    assert put_lora(lora_client, "alices-style", lora_bytes()).status_code == 201

    names_for_bob = [item["name"] for item in lora_client.get("/v1/loras", headers=auth("bob")).json["loras"]]
    assert names_for_bob == ["house-style"]
    assert lora_client.get("/v1/loras/alices-style", headers=auth("bob")).status_code == 404
    assert lora_client.delete("/v1/loras/alices-style", headers=auth("bob")).status_code == 404
    bobs_job = submit(lora_client, "bob", lora="alices-style")
    missing = submit(lora_client, "bob", lora="no-such-style")
    assert bobs_job.status_code == missing.status_code == 422
    missing_message = missing.json["error"]["message"]
    assert bobs_job.json["error"]["message"] == missing_message.replace("no-such-style", "alices-style")
    assert bobs_job.json["error"]["field"] == "lora"
    assert submit(lora_client, "bob", lora="house-style").status_code == 202  # the operator's stays usable


def test_a_missing_adapter_is_refused_at_submit_naming_it(lora_client):
    response = submit(lora_client, lora="nowhere")
    assert response.status_code == 422
    assert response.json["error"]["field"] == "lora"
    assert "'nowhere' does not exist" in response.json["error"]["message"]
    batch = lora_client.post(
        "/v1/jobs/batch", json={"jobs": [{"prompt": "a", "lora": "nowhere"}, {"prompt": "b"}]}, headers=auth("alice")
    ).json
    assert [result["status"] for result in batch["results"]] == [422, 202]
    assert batch["results"][0]["error"]["field"] == "jobs[0].lora"


@pytest.mark.parametrize(
    "body, message",
    [
        (b"\x80\x04\x95pickle data, never loaded", "is not a safetensors file"),
        (b"", "empty body"),
        (len(TRUNCATED_HEADER).to_bytes(8, "little") + TRUNCATED_HEADER, "malformed"),  # its data is missing
    ],
)
def test_an_upload_that_is_not_safetensors_is_refused_and_nothing_is_stored(lora_client, body, message):
    response = put_lora(lora_client, "bad", body)
    assert response.status_code == 422
    assert response.json["error"]["field"] == "body"
    assert message in response.json["error"]["message"]
    assert lora_client.get("/v1/loras/bad", headers=auth("alice")).status_code == 404


def test_an_oversized_upload_gets_413_and_the_adapters_stay_as_they_were(lora_client):
    assert put_lora(lora_client, "kept", lora_bytes()).status_code == 201
    response = put_lora(lora_client, "kept", b"x" * (MAX_LORA_BYTES + 1))
    assert response.status_code == 413
    assert response.json["error"]["code"] == "payload_too_large"
    assert lora_client.get("/v1/loras/kept", headers=auth("alice")).json["size_bytes"] == len(lora_bytes())
    assert submit(lora_client, lora="kept").status_code == 202


def test_a_bad_adapter_name_is_refused_naming_the_field(lora_client):
    response = put_lora(lora_client, "../escape", lora_bytes())
    assert response.status_code in (404, 422)
    response = submit(lora_client, lora="tenants/abc/x")
    assert response.status_code == 422 and response.json["error"]["field"] == "lora"


def test_deleting_an_upload_makes_jobs_naming_it_refused(lora_client):
    assert put_lora(lora_client, "short-lived", lora_bytes()).status_code == 201
    assert lora_client.delete("/v1/loras/short-lived", headers=auth("alice")).status_code == 204
    assert submit(lora_client, lora="short-lived").status_code == 422
    assert lora_client.delete("/v1/loras/short-lived", headers=auth("alice")).status_code == 404


def test_without_a_lora_store_jobs_naming_an_adapter_are_refused(client):
    response = client.post("/v1/jobs", json={"prompt": "a fox", "lora": "anything"}, headers=auth("alice"))
    assert response.status_code == 422 and "no LoRA store" in response.json["error"]["message"]
    assert client.get("/v1/loras", headers=auth("alice")).status_code == 404
