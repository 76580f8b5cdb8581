from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from storage.job_record import JobRecord, JobState
from storage.webhooks import WebhookSignatureError, build_payload, secret_bytes, sign, signed_headers, verify

KEY = b"0123456789abcdef"


def test_a_whsec_secret_is_base64_decoded_and_any_other_is_used_as_utf8():
    assert secret_bytes("whsec_" + base64.b64encode(KEY).decode()) == KEY
    assert secret_bytes("plain secret") == b"plain secret"


def test_a_whsec_secret_that_is_not_base64_is_refused_with_the_variable_named():
    with pytest.raises(ValueError, match="STEPWISE_WEBHOOK_SECRET"):
        secret_bytes("whsec_not base64!")


def test_the_signature_is_v1_hmac_sha256_of_id_timestamp_and_body():
    body = '{"type":"job.completed"}'
    expected = base64.b64encode(hmac.new(KEY, f"msg_1.1700000000.{body}".encode(), hashlib.sha256).digest())
    assert sign(KEY, "msg_1", 1700000000, body) == "v1," + expected.decode()


def test_signed_headers_verify_and_a_changed_body_does_not():
    body = '{"a":1}'
    headers = signed_headers(KEY, "msg_2", body, timestamp=1700000000)
    verify(KEY, headers, body, now=1700000010)
    with pytest.raises(WebhookSignatureError, match="no signature matches"):
        verify(KEY, headers, '{"a":2}', now=1700000010)


def test_a_stale_timestamp_is_refused():
    headers = signed_headers(KEY, "msg_3", "{}", timestamp=1700000000)
    with pytest.raises(WebhookSignatureError, match="away from now"):
        verify(KEY, headers, "{}", now=1700000000 + 3600)


def test_one_matching_signature_among_several_is_enough():
    headers = signed_headers(KEY, "msg_4", "{}", timestamp=1700000000)
    headers["webhook-signature"] = "v1,bm90LXRoaXMtb25l " + headers["webhook-signature"]
    verify(KEY, headers, "{}", now=1700000000)


def test_without_a_secret_no_signature_header_is_sent():
    assert "webhook-signature" not in signed_headers(None, "msg_5", "{}")


def test_a_completed_payload_gives_the_jobs_urls_as_its_view_does_not_storage_keys(tmp_path):
    from storage.local_image_store import LocalImageStore
    from storage.public_urls import image_urls, job_url

    record = JobRecord(
        job_id="j1",
        tenant="t",
        state=JobState.SUCCEEDED,
        params={},
        created_at=0.0,
        queue="stepwise.generate.test",
        image_keys=["j1/0.png", "j1/1.png"],
    )
    base = "http://127.0.0.1:8000"
    urls = image_urls(base, "j1", record.image_keys, LocalImageStore(tmp_path))
    payload = build_payload(record, "completed", status_url=job_url(base, "j1"), image_urls=urls)
    assert payload["type"] == "job.completed"
    assert payload["timestamp"].endswith("Z")
    assert payload["data"] == {
        "job_id": "j1",
        "state": "succeeded",
        "status_url": f"{base}/v1/jobs/j1",
        "image_urls": [f"{base}/v1/jobs/j1/image", f"{base}/v1/jobs/j1/image?index=1"],
    }


def test_a_failed_payload_carries_the_error():
    record = JobRecord(
        job_id="j2",
        tenant="t",
        state=JobState.FAILED,
        params={},
        created_at=0.0,
        queue="stepwise.generate.test",
        error_code="engine_error",
        error_message="boom",
    )
    payload = build_payload(record, "failed", status_url="http://127.0.0.1:8000/v1/jobs/j2")
    assert payload["data"]["error"] == {"code": "engine_error", "message": "boom"}
