"""The same assertions against the local folder and S3 (SeaweedFS over real HTTP), then S3's own
concerns: content type, presigned URLs (expiry and tampering, which SeaweedFS checks as S3 does),
credentials, and retries of transient failures (moto's server, where the tests inject the faults)."""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest

from storage.errors import ImageNotFoundError, StorageError, StorageUnavailableError
from storage.image_store import RetryPolicy, open_image_store
from storage.local_image_store import LocalImageStore
from storage.s3_image_store import S3ImageStore
from storage.settings import StorageSettings
from tests.support.network import LateProxy, ThrottlingS3
from tests.support.waiting import wait_for

METADATA = {"job_id": "job1", "seed": "7", "model": "builtin:tiny"}
QUICK_RETRY = RetryPolicy(max_attempts=3, initial_wait=0.01, max_wait=0.05)


def png_bytes() -> bytes:
    return b"\x89PNG\r\n\x1a\n" + os.urandom(256)


def s3_settings(endpoint_url: str, bucket: str, **kwargs) -> StorageSettings:
    return StorageSettings(storage_url=f"s3://{bucket}/images", s3_endpoint_url=endpoint_url, **kwargs)


@pytest.fixture(params=["local", "s3"])
def image_store(request, tmp_path):
    if request.param == "local":
        settings = StorageSettings(storage_url=(tmp_path / "images").as_uri())
    else:
        bucket = request.getfixturevalue("seaweed_bucket")
        settings = s3_settings(request.getfixturevalue("seaweed_server").endpoint_url, bucket)
    store = open_image_store(settings)
    yield store
    store.close()


@pytest.fixture
def s3_store(s3_server, s3_bucket):
    store = open_image_store(s3_settings(s3_server.endpoint_url, s3_bucket))
    yield store
    store.close()


def test_the_url_picks_the_backend(image_store):
    assert isinstance(image_store, (LocalImageStore, S3ImageStore))
    assert image_store.ping()


def test_keys_are_deterministic_per_job_and_image(image_store):
    assert image_store.key_for("job1", 2) == image_store.key_for("job1", 2)
    assert image_store.key_for("job1", 2).endswith("job1/2.png")
    assert image_store.key_for("job1", 2) != image_store.key_for("job1", 3)


def test_a_stored_png_reads_back_with_its_metadata(image_store):
    key = image_store.key_for("job1", 0)
    data = png_bytes()
    assert not image_store.exists(key)

    image_store.put_image(key, data, METADATA)

    assert image_store.exists(key)
    assert image_store.get_bytes(key) == data
    info = image_store.head(key)
    assert (info.size, info.content_type, info.metadata) == (len(data), "image/png", METADATA)


@pytest.mark.parametrize(
    "image_format, content_type",
    [("jpeg", "image/jpeg"), ("webp", "image/webp"), ("mp4", "video/mp4"), ("webm", "video/webm")],
)
def test_an_image_stored_in_another_format_has_its_content_type_on_the_stored_object(
    image_store, image_format, content_type
):
    key = image_store.key_for("job1", 0, image_format)

    image_store.put_image(key, b"not checked here", METADATA)

    assert key.endswith(f"job1/0.{image_format}")
    assert image_store.head(key).content_type == content_type
    url = image_store.presigned_url(key)
    if url is not None:  # S3: the presigned URL serves the object with the same type
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.headers["Content-Type"] == content_type


def test_storing_under_the_same_key_replaces_the_image(image_store):
    key = image_store.key_for("job1", 0)
    image_store.put_image(key, png_bytes(), METADATA)
    second = png_bytes()

    image_store.put_image(key, second, {**METADATA, "seed": "8"})

    assert image_store.get_bytes(key) == second
    assert image_store.head(key).metadata["seed"] == "8"


def test_a_missing_image_is_not_found(image_store):
    key = image_store.key_for("nobody", 0)

    assert image_store.head(key) is None
    with pytest.raises(ImageNotFoundError, match="nobody"):
        image_store.get_bytes(key)


def test_a_retried_upload_leaves_one_object(s3_store, s3_server, s3_bucket):
    key = s3_store.key_for("job1", 0)
    for _ in range(3):
        s3_store.put_image(key, png_bytes(), METADATA)

    client = boto3.client("s3", endpoint_url=s3_server.endpoint_url)
    listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="images/job1/")
    assert [item["Key"] for item in listed["Contents"]] == ["images/job1/0.png"]
    assert client.head_object(Bucket=s3_bucket, Key=key)["ContentType"] == "image/png"


def test_the_local_folder_holds_only_finished_files(tmp_path):
    store = open_image_store(StorageSettings(storage_url=(tmp_path / "images").as_uri()))
    key = store.key_for("job1", 0)
    store.put_image(key, png_bytes(), METADATA)
    store.put_image(key, png_bytes(), METADATA)

    assert sorted(path.name for path in (tmp_path / "images" / "job1").iterdir()) == ["0.png", "0.png.meta.json"]
    assert store.presigned_url(key) is None


def test_a_local_key_cannot_leave_the_image_folder(tmp_path):
    store = LocalImageStore(tmp_path)

    for key in ("../outside.png", "/etc/passwd", "job1/../../x.png"):
        with pytest.raises(ValueError, match="inside the image folder"):
            store.put_image(key, png_bytes(), {})


@pytest.fixture
def real_s3_store(seaweed_server, seaweed_bucket):
    store = open_image_store(s3_settings(seaweed_server.endpoint_url, seaweed_bucket))
    yield store
    store.close()


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_presigned_url_downloads_the_image_over_http(real_s3_store):
    key = real_s3_store.key_for("job1", 0)
    data = png_bytes()
    real_s3_store.put_image(key, data, METADATA)

    url = real_s3_store.presigned_url(key)

    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.read() == data
        assert response.headers["Content-Type"] == "image/png"


def test_a_presigned_url_is_refused_once_it_expired(seaweed_server, seaweed_bucket):
    store = open_image_store(s3_settings(seaweed_server.endpoint_url, seaweed_bucket, presign_expiry_seconds=900))
    key = store.key_for("job1", 0)
    store.put_image(key, png_bytes(), METADATA)
    assert parse_qs(urlsplit(store.presigned_url(key)).query)["X-Amz-Expires"] == ["900"]

    short = store.presigned_url(key, expiry=1)
    assert http_status(short) == 200
    # S3 counts whole seconds: refused from the second after expiry
    wait_for(lambda: http_status(short) == 403, 15, "the expired presigned URL to be refused", interval=0.2)
    assert http_status(store.presigned_url(key)) == 200
    store.close()


def test_a_tampered_presigned_url_is_refused(real_s3_store):
    for index in range(2):
        real_s3_store.put_image(real_s3_store.key_for("job1", index), png_bytes(), METADATA)
    url = real_s3_store.presigned_url(real_s3_store.key_for("job1", 0))

    assert http_status(url.replace("job1/0.png", "job1/1.png")) == 403  # another object with this signature
    assert http_status(url.replace("X-Amz-Expires=3600", "X-Amz-Expires=7200")) == 403  # a longer life


def test_a_wrong_secret_is_refused_without_retrying_and_ping_says_so(seaweed_server, seaweed_bucket, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    store = open_image_store(s3_settings(seaweed_server.endpoint_url, seaweed_bucket), retry=QUICK_RETRY)

    with pytest.raises(StorageError, match="SignatureDoesNotMatch|AccessDenied|403") as raised:
        store.put_image(store.key_for("job1", 0), png_bytes(), METADATA)
    assert not isinstance(raised.value, StorageUnavailableError)  # a setting to fix, not an outage to wait out
    assert store.ping() is False
    store.close()


def test_ping_is_false_for_a_bucket_that_does_not_exist(s3_server, s3_bucket):
    store = open_image_store(s3_settings(s3_server.endpoint_url, "no-such-bucket"))

    assert store.ping() is False


def test_an_unknown_storage_url_is_refused_with_the_variable_name():
    with pytest.raises(ValueError, match="STEPWISE_STORAGE_URL"):
        open_image_store(StorageSettings(storage_url="ftp://example.com/images"))


def test_an_upload_is_retried_until_the_server_starts_listening(s3_server, s3_bucket, caplog):
    proxy = LateProxy(s3_server.port, delay=0.6)
    retry = RetryPolicy(max_attempts=8, initial_wait=0.1, max_wait=0.5)
    store = open_image_store(s3_settings(proxy.endpoint_url, s3_bucket), retry=retry)
    key = store.key_for("job1", 0)
    data = png_bytes()
    proxy.start()  # after building the client, which can take longer than the delay on a busy machine
    started = time.monotonic()

    with caplog.at_level(logging.WARNING, logger="storage.s3_image_store"):
        store.put_image(key, data, METADATA)

    assert proxy.listening_at is not None and started < proxy.listening_at <= time.monotonic()
    assert any("Retrying" in message for message in caplog.messages)
    direct = open_image_store(s3_settings(s3_server.endpoint_url, s3_bucket))
    assert direct.get_bytes(key) == data
    proxy.stop()


def test_a_server_that_keeps_throttling_gives_storage_unavailable_after_the_retries(s3_bucket):
    # A stub HTTP server answering every request with S3's 503 SlowDown: real HTTP, fake S3.
    throttling = ThrottlingS3().start()
    store = open_image_store(s3_settings(throttling.endpoint_url, "stepwise-images"), retry=QUICK_RETRY)

    with pytest.raises(StorageUnavailableError, match="after 3 attempts"):
        store.put_image(store.key_for("job1", 0), png_bytes(), METADATA)

    assert throttling.num_requests == 3
    throttling.stop()


def test_an_unreachable_server_gives_storage_unavailable_after_the_retries(s3_bucket):
    proxy = LateProxy(target_port=1, delay=3600).start()  # a port on which nothing listens
    store = open_image_store(s3_settings(proxy.endpoint_url, "stepwise-images"), retry=QUICK_RETRY)

    with pytest.raises(StorageUnavailableError, match="download of s3://stepwise-images/images/job1/0.png"):
        store.get_bytes(store.key_for("job1", 0))
    proxy.stop()


def test_the_local_folder_flushes_images_to_disk_on_flush_not_on_put(tmp_path, monkeypatch):
    store = LocalImageStore(tmp_path / "images")
    flushed: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: flushed.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    keys = [store.key_for("job1", index) for index in range(2)]

    for key in keys:
        store.put_image(key, png_bytes(), METADATA)
    assert flushed == [], "a put leaves the disk flush to flush(), after the job's end state"
    store.flush(keys)

    assert flushed == [str(store.path_for(key)) for key in keys] + [str(store.path_for(keys[0]).parent)]


def test_the_local_folder_retries_a_failed_write_as_s3_does_and_then_says_storage_is_unavailable(tmp_path):
    images, data = tmp_path / "images", png_bytes()
    store = LocalImageStore(images, retry=RetryPolicy(max_attempts=20, initial_wait=0.05, max_wait=0.2))
    impatient = LocalImageStore(images, retry=RetryPolicy(max_attempts=2, initial_wait=0.01, max_wait=0.01))
    images.rmdir()
    images.write_text("the folder failed: a file stands at its path")
    restore = threading.Timer(0.3, lambda: (images.unlink(), images.mkdir()))
    restore.start()

    store.put_image("j1/0.png", data, {"job_id": "j1"})  # rides out the failure, as an S3 upload does

    restore.join()
    assert store.get_bytes("j1/0.png") == data
    images.rename(tmp_path / "away")
    images.write_text("failed for good")
    with pytest.raises(StorageUnavailableError, match="could not write image 'j2/0.png' .* after 2 attempts"):
        impatient.put_image("j2/0.png", png_bytes(), {"job_id": "j2"})
