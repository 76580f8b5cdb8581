"""Webhook payloads and Standard Webhooks signatures (https://www.standardwebhooks.com).

A delivery carries three headers: `webhook-id` (the same on every retry of one event),
`webhook-timestamp` (unix seconds of this attempt) and `webhook-signature`
(`v1,` + base64 HMAC-SHA256 of `{id}.{timestamp}.{body}`). The secret comes from
`STEPWISE_WEBHOOK_SECRET`: `whsec_<base64>` is decoded, anything else is used as UTF-8 bytes.
Pure standard library, so receivers can copy `verify` as it is.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.job_record import JobRecord

EVENTS = ("started", "progress", "completed", "failed", "canceled")
EVENT_FOR_STATE = {"running": "started", "succeeded": "completed", "failed": "failed", "canceled": "canceled"}
DEFAULT_EVENTS = tuple(event for event in EVENTS if event in EVENT_FOR_STATE.values())  # progress: when asked
assert set(EVENTS) == {*DEFAULT_EVENTS, "progress"}
PROGRESS_SECONDS = 1.0  # at most one progress event per job per this many seconds
SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_SECONDS = 5 * 60


class WebhookSignatureError(ValueError):
    """A webhook's signature headers are missing, stale or do not match its body."""


def secret_bytes(secret: str) -> bytes:
    """The HMAC key for a configured secret (`whsec_<base64>` or a plain string)."""
    if secret.startswith(SECRET_PREFIX):
        try:
            key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
        except binascii.Error:
            key = b""
        if not key:
            raise ValueError(
                "STEPWISE_WEBHOOK_SECRET starts with whsec_ but the rest is not base64 "
                "(make one: python3 -c \"import base64, os; print('whsec_' + "
                'base64.b64encode(os.urandom(24)).decode())")'
            )
        return key
    return secret.encode("utf-8")


def sign(key: bytes, webhook_id: str, timestamp: int, body: str) -> str:
    digest = hmac.new(key, f"{webhook_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signed_headers(key: bytes | None, webhook_id: str, body: str, *, timestamp: int | None = None) -> dict[str, str]:
    """Headers for one delivery attempt; without a key the signature header is left out."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    headers = {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp), "content-type": "application/json"}
    if key is not None:
        headers["webhook-signature"] = sign(key, webhook_id, timestamp, body)
    return headers


def verify(
    key: bytes,
    headers: dict[str, str],
    body: str | bytes,
    *,
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> None:
    """Raise WebhookSignatureError unless the headers sign this body with `key` recently enough.

    `webhook-signature` may hold several space-separated signatures (key rotation); one
    matching `v1` signature is enough.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    webhook_id = lowered.get("webhook-id")
    raw_timestamp = lowered.get("webhook-timestamp")
    signatures = lowered.get("webhook-signature")
    if not webhook_id or not raw_timestamp or not signatures:
        raise WebhookSignatureError("missing webhook-id, webhook-timestamp or webhook-signature header")
    try:
        timestamp = int(raw_timestamp)
    except ValueError as e:
        raise WebhookSignatureError(f"webhook-timestamp is not an integer (got {raw_timestamp!r})") from e
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance_seconds:
        raise WebhookSignatureError(f"webhook-timestamp is more than {tolerance_seconds}s away from now")
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    expected = sign(key, webhook_id, timestamp, text)
    for candidate in signatures.split():
        if candidate.startswith("v1,") and hmac.compare_digest(candidate, expected):
            return
    raise WebhookSignatureError("no signature matches")


def rfc3339_now() -> str:
    """Now, as every time a client sees is written: UTC, milliseconds, `Z`."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def build_payload(record: JobRecord, event: str, *, status_url: str, image_urls: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON body for `event` about this job, as the receiver sees it: the job's URLs as its view
    gives them (`storage.public_urls`), never storage keys."""
    assert event in EVENTS, event
    data: dict[str, Any] = {"job_id": record.job_id, "state": record.state.value, "status_url": status_url}
    if event == "progress":
        data["progress"] = record.progress_view()
    if image_urls:
        data["image_urls"] = list(image_urls)
    if record.error_code or record.error_message:
        data["error"] = {"code": record.error_code, "message": record.error_message}
    return {
        "type": f"job.{event}",
        "timestamp": rfc3339_now(),
        "data": data,
    }
