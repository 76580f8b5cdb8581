"""Reading request bodies: strict JSON (no NaN or Infinity), 400 when it does not parse.

The body must say it is JSON (`Content-Type: application/json`, or a `+json` type): a form,
multipart or plain-text body gets 415, so a client that sends the wrong thing hears it.

The size limit is Flask's MAX_CONTENT_LENGTH (STEPWISE_MAX_BODY_BYTES): reading a larger
body raises 413 before any of it is parsed.
"""

from __future__ import annotations

import json
from typing import Any

from flask import request

from api.errors import ApiError


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def is_json_type(mimetype: str) -> bool:
    return mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))


def read_json() -> Any:
    if not is_json_type(request.mimetype):
        shown = request.mimetype or "none"
        raise ApiError(
            415, "unsupported_media_type", f"send the body as JSON with Content-Type: application/json (got {shown})"
        )
    raw = request.get_data(cache=True)
    if not raw.strip():
        raise ApiError(400, "malformed_json", "the request body is empty; send a JSON object")
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except UnicodeDecodeError as e:  # a charset parameter changes nothing: JSON is UTF-8 (RFC 8259)
        raise ApiError(
            400, "malformed_json", f"the request body is not UTF-8 (JSON is UTF-8 whatever the charset says): {e}"
        ) from e
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise ApiError(400, "malformed_json", f"the request body is not valid JSON: {e}") from e
