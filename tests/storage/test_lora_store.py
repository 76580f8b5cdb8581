"""The LoRA store behind the same code for a local folder and S3 (moto's server over HTTP): tenant uploads
stay under the tenant's prefix, resolve() prefers the tenant's own, and the engine reads an S3 store
through the fetcher the worker gives it."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from safetensors.numpy import save

from storage.errors import LoraTooLargeError
from storage.lora_store import LoraStore, open_lora_store, tenant_key
from storage.settings import StorageSettings

FILE = save(
    {"unet.x.lora_A.weight": np.ones((2, 4), dtype=np.float32), "unet.x.lora_B.weight": np.ones((4, 2), np.float32)}
)


@pytest.fixture(params=["file", "s3"])
def lora_store(request, tmp_path) -> LoraStore:
    if request.param == "file":
        return open_lora_store(StorageSettings(lora_url=(tmp_path / "loras").as_uri()))
    s3_server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
    return open_lora_store(StorageSettings(lora_url=f"s3://{bucket}/loras", s3_endpoint_url=s3_server.endpoint_url))


def test_uploads_are_listed_and_resolved_only_for_their_tenant(lora_store):
    lora_store.put("shared", FILE)
    lora_store.put(tenant_key("alice", "mine"), FILE)
    lora_store.put(tenant_key("alice", "shared"), FILE + b"")

    assert [info.name for info in lora_store.list("")] == ["shared"]
    assert [info.name for info in lora_store.list(tenant_key("alice", "x").rsplit("/", 1)[0])] == ["mine", "shared"]
    assert lora_store.resolve("alice", "mine") == tenant_key("alice", "mine")
    assert lora_store.resolve("alice", "shared") == tenant_key("alice", "shared")  # her own shadows the operator's
    assert lora_store.resolve("bob", "mine") is None
    assert lora_store.resolve("bob", "shared") == "shared"
    assert lora_store.get(tenant_key("alice", "mine")) == FILE
    assert lora_store.delete(tenant_key("alice", "mine")) and not lora_store.delete(tenant_key("alice", "mine"))
    assert lora_store.resolve("alice", "mine") is None


def test_the_engine_source_reads_an_s3_store_through_the_injected_fetcher(s3_server, s3_bucket):
    from batching.lora.store import LoraSource
    from core.errors import LoraError

    store = open_lora_store(StorageSettings(lora_url=f"s3://{s3_bucket}", s3_endpoint_url=s3_server.endpoint_url))
    store.put("style", FILE)
    store.put("pickle", b"\x80\x04not safetensors")
    source = LoraSource(f"s3://{s3_bucket}", fetcher=store.get)

    assert source.read("style").data == FILE
    with pytest.raises(LoraError, match="'missing' does not exist"):
        source.read("missing")
    with pytest.raises(LoraError, match="'pickle' is not a safetensors file"):
        source.read("pickle")
    with pytest.raises(ValueError, match="needs a fetcher"):
        LoraSource(f"s3://{s3_bucket}")


def test_the_worker_read_refuses_a_file_above_the_limit_before_reading_it(lora_store):
    from batching.lora.store import LoraSource
    from core.errors import LoraError

    lora_store.put("big", FILE)
    source = LoraSource("s3://any", fetcher=functools.partial(lora_store.get_at_most, max_bytes=len(FILE) - 1))

    with pytest.raises(LoraTooLargeError, match=f"is {len(FILE)} bytes, above the limit of {len(FILE) - 1}"):
        lora_store.get_at_most("big", max_bytes=len(FILE) - 1)
    with pytest.raises(LoraError, match="'big' could not be read from the store: LoraTooLargeError"):
        source.read("big")
    assert lora_store.get_at_most("big", max_bytes=len(FILE)) == FILE
    assert lora_store.get_at_most("missing", max_bytes=len(FILE)) is None
