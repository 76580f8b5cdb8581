"""One JSON error shape for every error the API returns:

    {"error": {"code": "invalid_params", "message": "height must be ...", "field": "height"}}

`field` is present only when one request field is at fault. Every exception that
reaches Flask goes through `handle_error`, so no route can answer with an HTML page. Under
`TESTING` an unexpected error is raised into the test instead of answering 500.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, current_app, jsonify
from kombu.exceptions import OperationalError as BrokerError
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from core.errors import InvalidParamsError
from storage.errors import JobNotFoundError, RedisUnavailableError, StorageUnavailableError
from storage.redis_errors import is_unavailable

log = logging.getLogger(__name__)

WERKZEUG_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    431: "headers_too_large",
}


class ApiError(Exception):
    """An error with its HTTP status, machine-readable code and human message."""

    def __init__(
        self, status: int, code: str, message: str, *, field: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        return {"error": error}


def invalid(field: str | None, message: str) -> ApiError:
    return ApiError(422, "invalid_params", message, field=field)


def not_found(what: str = "job") -> ApiError:
    return ApiError(404, "not_found", f"{what} not found")


OBJECT_MESSAGES = {
    "extra_forbidden": "is not a known field",
    "model_type": "must be a JSON object",
    "dict_type": "must be a JSON object",
}


def field_path(loc: tuple[Any, ...]) -> str | None:
    """pydantic's error location -> `jobs[2].height`."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


def from_validation_error(error: ValidationError, prefix: tuple[Any, ...] = ()) -> ApiError:
    first = error.errors(include_url=False)[0]
    loc = prefix + tuple(first["loc"])
    field = field_path(loc)
    message = OBJECT_MESSAGES.get(first["type"], first["msg"])
    if first["type"] == "value_error":  # a validator's own ValueError: its message, without pydantic's prefix
        message = str(first["ctx"]["error"])
    if field is None:
        joiner = " " if first["type"] in OBJECT_MESSAGES else ": "
        return invalid(None, f"the request body{joiner}{message}")
    return invalid(field, f"{field}: {message}")


def from_params_error(error: InvalidParamsError, prefix: str = "") -> ApiError:
    field = f"{prefix}{error.field}" if error.field != "params" else (prefix.rstrip(".") or None)
    return invalid(field, f"{prefix}{error}")


def to_api_error(error: Exception) -> ApiError:
    if isinstance(error, ApiError):
        return error
    if isinstance(error, ValidationError):
        return from_validation_error(error)
    if isinstance(error, InvalidParamsError):
        return from_params_error(error)
    if isinstance(error, HTTPException) and error.code is not None and error.code < 500:
        code = WERKZEUG_CODES.get(error.code, "http_error")
        message = error.description or error.name
        if error.code == 413:
            message = "request body is larger than the limit (STEPWISE_MAX_BODY_BYTES)"
        return ApiError(error.code, code, message)
    if isinstance(error, JobNotFoundError):
        return not_found()
    if isinstance(error, RedisUnavailableError) or is_unavailable(error):  # also a store's unwrapped Redis error
        log.warning("Redis unavailable: %s: %s", type(error).__name__, error)
        return ApiError(
            503,
            "unavailable",
            "Redis is unavailable (down, or failing over to a replica); retry later (a job with the same "
            "Idempotency-Key, so that a retry cannot make two)",
            headers={"Retry-After": "2"},
        )
    if isinstance(error, (StorageUnavailableError, BrokerError)):
        log.warning("dependency unavailable: %s: %s", type(error).__name__, error)
        return ApiError(
            503,
            "unavailable",
            "a backing service (Redis or image storage) is unavailable; retry later",
            headers={"Retry-After": "5"},
        )
    log.exception("unhandled error", exc_info=error)
    return ApiError(500, "internal", "internal server error")


def handle_error(error: Exception):
    api_error = to_api_error(error)
    if api_error.status == 500 and current_app.testing:
        # What Flask's TESTING does for an app without a catch-all handler: the test sees the exception itself.
        raise error
    response = jsonify(api_error.body())
    response.status_code = api_error.status
    if isinstance(error, MethodNotAllowed) and error.valid_methods:
        response.headers["Allow"] = ", ".join(error.valid_methods)
    response.headers.update(api_error.headers)
    return response


def register(app: Flask) -> None:
    app.register_error_handler(Exception, handle_error)
