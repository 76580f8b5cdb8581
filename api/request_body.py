"""Reading request bodies: strict JSON (no NaN or Infinity), 400 when it does not parse; multipart forms.

The body must say it is JSON (`Content-Type: application/json`, or a `+json` type): a form,
multipart or plain-text body gets 415, so a client that sends the wrong thing hears it.

The size limit is Flask's MAX_CONTENT_LENGTH (STEPWISE_MAX_BODY_BYTES, or a route's own): reading
a larger body raises 413 before any of it is parsed. A multipart form may also have at most
STEPWISE_MAX_FORM_PARTS parts (werkzeug's max_form_parts): more get a 413 that says so.
"""

from __future__ import annotations

import json
from typing import Any

from flask import request
from werkzeug.datastructures import FileStorage, MultiDict
from werkzeug.exceptions import RequestEntityTooLarge

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


def read_form() -> tuple[MultiDict[str, str], MultiDict[str, FileStorage]]:
    """The multipart form's text fields and files. werkzeug answers 413 alike for a body over the limit and for
    too many parts; within the limit it can only be the parts (api: no limit on a text part's size)."""
    try:
        return request.form, request.files
    except RequestEntityTooLarge as e:
        limit, length = request.max_content_length, request.content_length
        if length is None or (limit is not None and length > limit):
            raise
        parts = request.max_form_parts
        raise ApiError(
            413, "too_many_parts", f"the form has more than {parts} parts (STEPWISE_MAX_FORM_PARTS)", field="body"
        ) from e
