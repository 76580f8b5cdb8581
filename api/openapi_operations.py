"""What each route declares about itself for the OpenAPI document (api.openapi builds the document from them).

A route says, beside its code, what it takes and what it answers:

    @bp.get("")
    @documented(
        "The caller's jobs, newest first.",
        query=ListQuery,
        responses={200: Answer("A page of jobs.", JobList)},
        errors=api_errors(422, 503),
    )
    def list_jobs():
        query = query_of(ListQuery)

The models are the ones the route validates with (`query_of` and `body_of` refuse a model the route does
not declare), the path is the route's own rule, its parameters come from the rule's arguments, and who may
call it (and so its 401/403) from its blueprint's `require_tenant` / `require_admin` hook; so a route and its
documentation cannot drift apart. The operation id is the view function's name in lowerCamelCase.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flask import current_app, request
from pydantic import BaseModel, ValidationError

from api.answers import ErrorResponse
from api.errors import from_validation_error
from api.request_body import read_json
from core.output_formats import IMAGE_FORMATS, OUTPUT_FORMATS

ERROR_MEANINGS = {  # the API's own error statuses (api.errors), as the document explains them
    400: "Malformed JSON.",
    401: "Missing or invalid API key.",
    403: "The API key is not an admin key.",
    404: "No such job (or upload, or adapter) for this key; for /v1/loras also: no LoRA store.",
    409: "Conflict with the job's state or an earlier request.",
    413: "Request body too large, or a form of too many parts (STEPWISE_MAX_FORM_PARTS).",
    415: "The body is not sent as JSON (Content-Type: application/json).",
    422: "A field is invalid; `error.field` names it.",
    429: "The queue, the tenant's queued jobs or its jobs per minute are at their limit.",
    503: "Redis, storage or the queue is unavailable.",
}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}}
BINARY = {"schema": {"type": "string", "format": "binary"}}
IMAGE_TYPES = tuple(IMAGE_FORMATS.values())
OUTPUT_TYPES = tuple(dict.fromkeys(OUTPUT_FORMATS.values()))  # what a job's output is served as: images and videos


@dataclass(frozen=True)
class Answer:
    """One documented response."""

    description: str
    model: type[BaseModel] | None = None  # a JSON body of this model
    content: Mapping[str, Any] | None = None  # or: media type -> {"schema": ...}
    headers: Mapping[str, Any] = field(default_factory=dict)  # name -> OpenAPI header object


@dataclass(frozen=True)
class Operation:
    summary: str
    responses: Mapping[int, Answer]  # the answers that are not errors
    errors: Mapping[int, str]  # error status -> meaning (401 and 403 come from the route's auth)
    error_model: type[BaseModel]  # the body of every error answer
    body: type[BaseModel] | None  # a JSON body, validated with this model
    form: type[BaseModel] | None  # or a multipart/form-data body, its parts this model's fields
    body_content: Mapping[str, Any] | None  # or another body: media type -> {"schema": ...}
    query: type[BaseModel] | None  # the query string, validated with this model
    parameters: tuple[dict[str, Any], ...]  # headers the route reads (path parameters: api.openapi)


def parameter(
    name: str, where: str, description: str, max_length: int, *, pattern: str, required: bool = True
) -> dict[str, Any]:
    """A string parameter of a path or header, with the pattern the API holds it to."""
    return {
        "name": name,
        "in": where,
        "required": required,
        "description": description,
        "schema": {"type": "string", "minLength": 1, "maxLength": max_length, "pattern": pattern},
    }


def api_errors(*statuses: int) -> dict[int, str]:
    return {status: ERROR_MEANINGS[status] for status in statuses}


View = TypeVar("View", bound=Callable[..., Any])
Model = TypeVar("Model", bound=BaseModel)


def documented(
    summary: str,
    *,
    responses: Mapping[int, Answer],
    errors: Mapping[int, str] | None = None,
    error_model: type[BaseModel] = ErrorResponse,
    body: type[BaseModel] | None = None,
    form: type[BaseModel] | None = None,
    body_content: Mapping[str, Any] | None = None,
    query: type[BaseModel] | None = None,
    parameters: tuple[dict[str, Any], ...] = (),
) -> Callable[[View], View]:
    """Declares the view's operation (under the route decorator, so the registered view carries it)."""
    operation = Operation(summary, responses, errors or {}, error_model, body, form, body_content, query, parameters)

    def declare(view: View) -> View:
        view.openapi_operation = operation  # type: ignore[attr-defined]
        return view

    return declare


def operation_of(view: Callable[..., Any]) -> Operation | None:
    return getattr(view, "openapi_operation", None)


def declared(model: type[Model], kind: str) -> type[Model]:
    operation = operation_of(current_app.view_functions[request.endpoint or ""])
    assert operation is not None and getattr(operation, kind) is model, f"the route does not declare {kind} {model}"
    return model


def query_of(model: type[Model]) -> Model:
    """The query string, validated with the model the route declares (a 422 naming the parameter)."""
    try:
        return declared(model, "query").model_validate(request.args.to_dict())
    except ValidationError as e:
        raise from_validation_error(e) from e


def body_of(model: type[Model]) -> Model:
    """The JSON body, validated with the model the route declares (a 422 naming the field)."""
    try:
        return declared(model, "body").model_validate(read_json())
    except ValidationError as e:
        raise from_validation_error(e) from e
