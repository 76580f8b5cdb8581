"""LoRA adapters through the API (in-process Flask app on real Redis): tenant uploads, listing, isolation,
and jobs naming adapters refused at submit when the tenant cannot use them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from safetensors.numpy import save

from api import create_app
from api.settings import ApiSettings
from storage.settings import StorageSettings
from tests.support.calls import auth
from tests.support.processes import TENANT_KEYS

MAX_LORA_BYTES = 2**19  # room for the deeply nested header below
TRUNCATED_HEADER = b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'


def lora_bytes(rank: int = 2) -> bytes:
    """A small, valid safetensors file with LoRA-style keys (the API checks the format, not the weights)."""
    return save(
        {
            "unet.mid_block.attentions.0.proj_in.lora_A.weight": np.ones((rank, 8), dtype=np.float32),
            "unet.mid_block.attentions.0.proj_in.lora_B.weight": np.zeros((8, rank), dtype=np.float32),
        }
    )


def raw_safetensors(header: dict, data: bytes = b"") -> bytes:
    """A file with exactly this header, whatever it claims (safetensors' writers refuse to write lies)."""
    return raw_header(json.dumps(header).encode()) + data


def raw_header(encoded: bytes) -> bytes:
    return len(encoded).to_bytes(8, "little") + encoded


def f32_entry(shape: list, start: int = 0, end: int | None = None) -> dict:
    end = start + 4 * math.prod(shape) if end is None else end
    return {"dtype": "F32", "shape": shape, "data_offsets": [start, end]}


def lora_with(**tensors: np.ndarray) -> bytes:
    """A valid adapter plus (or with replaced) `tensors`, keyed by their names with '/' for '.'."""
    module = "unet.mid_block.attentions.0.proj_in"
    weights = {
        f"{module}.lora_A.weight": np.ones((2, 8), dtype=np.float32),
        f"{module}.lora_B.weight": np.zeros((8, 2), dtype=np.float32),
    }
    for name, tensor in tensors.items():
        weights[name.replace("/", ".")] = tensor
    return save({name: tensor for name, tensor in weights.items() if tensor is not None})


MODULE = "unet/mid_block/attentions/0/proj_in"
KOHYA = "lora_unet_mid_block_attentions_0_proj_in"


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
    return create_app({"TESTING": True, "API_SETTINGS": settings}).test_client()


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
        (len(TRUNCATED_HEADER).to_bytes(8, "little") + TRUNCATED_HEADER, "cover 16 of its 0 data bytes"),  # no data
        # what a probe sent: a header nested 200,000 levels deep (it was a RecursionError and a 500)
        pytest.param(
            raw_header(b'{"w": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
            "header is nested too deeply",
            id="header nested 200000 levels deep",
        ),
    ],
)
def test_an_upload_that_is_not_safetensors_is_refused_and_nothing_is_stored(lora_client, body, message):
    response = put_lora(lora_client, "bad", body)
    assert response.status_code == 422
    assert response.json["error"]["field"] == "body"
    assert message in response.json["error"]["message"]
    assert lora_client.get("/v1/loras/bad", headers=auth("alice")).status_code == 404


@pytest.mark.parametrize(
    "body, message",
    [
        pytest.param(
            raw_safetensors({"w": f32_entry([100000, 100000], end=16)}, bytes(16)),
            "shape [100000, 100000] of F32 is 40000000000 bytes, its data_offsets span 16",
            id="a 16-byte tensor declared 100000x100000",
        ),
        pytest.param(
            raw_safetensors({"w": f32_entry([2**32, 2**32, 4], end=0)}), "its data_offsets span 0", id="size overflow"
        ),
        pytest.param(
            raw_safetensors({"a": f32_entry([2]), "b": f32_entry([2], start=4)}, bytes(12)),
            "tensor 'b''s data overlaps another",
            id="overlapping tensors",
        ),
        pytest.param(
            raw_safetensors({"w": f32_entry([1], start=4)}, bytes(8)), "leaves a gap before it", id="gap in the data"
        ),
        pytest.param(
            raw_safetensors({"w": f32_entry([1])}, bytes(8)), "cover 4 of its 8 data bytes", id="data past the tensors"
        ),
        pytest.param(
            raw_safetensors({"w": {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 16]}}, bytes(16)),
            "shape must be a list of non-negative integers",
            id="negative dimension",
        ),
        pytest.param(
            raw_safetensors({"w": {"dtype": "F13", "shape": [1], "data_offsets": [0, 4]}}, bytes(4)),
            "unknown dtype 'F13'",
            id="unknown dtype",
        ),
        pytest.param(
            raw_safetensors({"__metadata__": {"a": [1, 2]}, "w": f32_entry([1])}, bytes(4)),
            "__metadata__ must map strings to strings",
            id="metadata not strings",
        ),
        pytest.param(
            (2**62).to_bytes(8, "little") + b'{"w": {}}',
            "its header length, 4611686018427387904, exceeds the file",
            id="header length huge",
        ),
        pytest.param(
            save({"unet.conv_in.weight": np.zeros((4, 4), dtype=np.float32)}),
            "holds no LoRA weights (no tensor name contains 'lora'",
            id="no LoRA keys",
        ),
        pytest.param(
            lora_with(**{f"{MODULE}/lora_A/weight": None}),
            "has 'unet.mid_block.attentions.0.proj_in.lora_B.weight' without its 'lora_A.weight'",
            id="up matrix alone",
        ),
        pytest.param(
            lora_with(**{f"{MODULE}/lora_A/weight": np.ones((3, 8), dtype=np.float32)}),
            "shaped [3, 8] (down) and [8, 2] (up), which do not multiply",
            id="ranks differ",
        ),
        pytest.param(
            lora_with(
                **{
                    f"{MODULE}/lora_A/weight": np.ones((0, 8), np.float32),
                    f"{MODULE}/lora_B/weight": np.ones((8, 0), np.float32),
                }
            ),
            "which do not multiply",
            id="rank 0",
        ),
        pytest.param(
            lora_with(
                **{
                    f"{MODULE}/lora_A/weight": np.ones(16, np.float32),
                    f"{MODULE}/lora_B/weight": np.ones(16, np.float32),
                }
            ),
            "both must be 2-D (linear) or 4-D (conv)",
            id="1-D matrices",
        ),
        pytest.param(
            lora_with(**{f"{MODULE}/lora_A/weight": np.ones((2, 8), np.int8)}),
            "in I8/F32; they must be one of BF16, F16, F32, F64",
            id="int8 weights",
        ),
        pytest.param(
            save(
                {
                    f"{KOHYA}.lora_down.weight": np.ones((2, 8), np.float32),
                    f"{KOHYA}.lora_up.weight": np.ones((8, 2), np.float32),
                    f"{KOHYA}.alpha": np.array(np.nan, np.float32),
                }
            ),
            f"has alpha '{KOHYA}.alpha' of nan; it must be a finite number",
            id="NaN alpha",
        ),
        pytest.param(
            save(
                {
                    f"{KOHYA}.lora_down.weight": np.ones((2, 8), np.float16),
                    f"{KOHYA}.lora_up.weight": np.ones((8, 2), np.float16),
                    f"{KOHYA}.alpha": np.ones(3, np.float16),
                }
            ),
            "of F16 [3]; it must be one floating-point number",
            id="alpha not a scalar",
        ),
    ],
)
def test_an_upload_whose_header_lies_or_whose_lora_matrices_do_not_pair_is_refused_naming_the_problem(
    lora_client, body, message
):
    response = put_lora(lora_client, "hostile", body)
    assert response.status_code == 422, response.json
    assert response.json["error"]["field"] == "body"
    assert message in response.json["error"]["message"]
    assert lora_client.get("/v1/loras/hostile", headers=auth("alice")).status_code == 404


def test_kohya_adapters_with_a_finite_alpha_and_half_precision_weights_are_accepted(lora_client):
    body = save(
        {
            f"{KOHYA}.lora_down.weight": np.ones((2, 8), np.float16),
            f"{KOHYA}.lora_up.weight": np.ones((8, 2), np.float16),
            f"{KOHYA}.alpha": np.array(-1.0, np.float16),  # negative: the adapter's direction flips, as lora_scale may
            "dora_scale_or_other.unknown": np.ones(1, np.float32),  # keys in other forms are diffusers' to judge
        },
        metadata={"ss_network_dim": "2"},
    )
    assert put_lora(lora_client, "kohya-style", body).status_code == 201


@pytest.mark.parametrize(
    "name", ["stíl", "naïve-ünïcode", "a" * 101, ".hidden", "-dash-first", "sub/folder", "..", "%2e%2e%2fescape"]
)
def test_an_adapter_name_that_is_not_plain_ascii_or_too_long_or_a_path_is_refused_and_nothing_is_stored(
    lora_client, lora_folder, name
):
    response = put_lora(lora_client, name, lora_bytes())
    assert response.status_code in (404, 422), response.status_code
    if response.status_code == 422:
        assert response.json["error"]["field"] == "name"
    stored = sorted(path.relative_to(lora_folder).as_posix() for path in lora_folder.rglob("*") if path.is_file())
    assert stored == ["house-style.safetensors"]


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
