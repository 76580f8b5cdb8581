"""The OpenAPI 3.1 document served at GET /openapi.json, built from the app's own routes: each route's rule,
methods and auth, and the operation it declares beside its code (api.openapi_operations), whose models
are the pydantic models it validates with. A route without a declaration stops the app from starting.
"""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, Flask
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode
from werkzeug.routing import Rule

from api import jobs, loras, openai_videos
from api.auth import require_admin, require_tenant
from api.openapi_operations import ERROR_MEANINGS, RETRY_AFTER, Answer, Operation, documented, operation_of
from api.resources import get_openapi_document
from api.settings import ApiSettings

bp = Blueprint("openapi", __name__)

REF = "#/components/schemas/{model}"
# A path argument's name -> its parameter (what the route checks it against).
PATH_PARAMETERS = {"job_id": jobs.JOB_ID, "name": loras.LORA_NAME, "video_id": openai_videos.VIDEO_ID}
PATH_ARGUMENT = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
NOT_THE_JSON_API = {"static", "web.index"}  # the web page and its files
IGNORED_METHODS = {"HEAD", "OPTIONS"}


@bp.get("/openapi.json")
@documented(
    "This document.",
    responses={200: Answer("OpenAPI 3.1.", content={"application/json": {"schema": {"type": "object"}}})},
)
def openapi():
    return get_openapi_document()


class UndocumentedRoute(Exception):
    """A route the document cannot describe: the app does not start (a test sees it at once)."""


class Components:
    """The document's schemas, filled as operations name models."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def ref(self, model: type[BaseModel], mode: JsonSchemaMode = "serialization") -> dict[str, str]:
        schema = model.model_json_schema(ref_template=REF, mode=mode)
        self.schemas.update(schema.pop("$defs", {}))
        self.schemas[model.__name__] = schema
        return {"$ref": REF.format(model=model.__name__)}

    def response(self, answer: Answer) -> dict[str, Any]:
        rendered: dict[str, Any] = {"description": answer.description}
        if answer.model is not None:
            rendered["content"] = {"application/json": {"schema": self.ref(answer.model)}}
        elif answer.content is not None:
            rendered["content"] = dict(answer.content)
        if answer.headers:
            rendered["headers"] = dict(answer.headers)
        return rendered


def query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """A query model's fields as OpenAPI parameters (a query string cannot carry null)."""
    parameters = []
    document = model.model_json_schema(mode="validation")
    for name, schema in document["properties"].items():
        options = [option for option in schema.pop("anyOf", []) if option.get("type") != "null"]
        if options:
            schema.update(options[0])
        if schema.get("default") is None:
            schema.pop("default", None)
        description = schema.pop("description", "")
        parameters.append(
            {
                "name": name,
                "in": "query",
                "required": name in document.get("required", ()),
                "description": description,
                "schema": schema,
            }
        )
    return parameters


def auth_of(app: Flask, rule: Rule) -> str | None:
    """ "admin" or "tenant" by the route's blueprint hook (api.auth), None for a public route."""
    blueprint = rule.endpoint.rpartition(".")[0]
    hooks = app.before_request_funcs.get(blueprint, [])
    return "admin" if require_admin in hooks else "tenant" if require_tenant in hooks else None


def operation_id(view_name: str) -> str:
    first, *rest = view_name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def render(app: Flask, rule: Rule, view_name: str, operation: Operation, components: Components) -> dict[str, Any]:
    auth = auth_of(app, rule)
    unknown = [name for name in PATH_ARGUMENT.findall(rule.rule) if name not in PATH_PARAMETERS]
    if unknown:
        raise UndocumentedRoute(f"{rule.rule}: no parameter for {', '.join(unknown)} in api.openapi.PATH_PARAMETERS")
    parameters = [PATH_PARAMETERS[name] for name in PATH_ARGUMENT.findall(rule.rule)]
    if operation.query is not None:
        parameters += query_parameters(operation.query)
    parameters += operation.parameters
    rendered: dict[str, Any] = {"operationId": operation_id(view_name), "summary": operation.summary}
    if auth is None:
        rendered["security"] = []
    if parameters:
        rendered["parameters"] = parameters
    content: dict[str, Any] = {}  # a route may take JSON, a form, or either
    if operation.body is not None:
        content["application/json"] = {"schema": components.ref(operation.body, "validation")}
    if operation.form is not None:
        content["multipart/form-data"] = {"schema": components.ref(operation.form, "validation")}
    if not content and operation.body_content is not None:
        content = dict(operation.body_content)
    if content:
        rendered["requestBody"] = {"required": True, "content": content}
    errors = dict(operation.errors)
    for status in (401,) if auth == "tenant" else (401, 403) if auth == "admin" else ():
        errors.setdefault(status, ERROR_MEANINGS[status])
    responses = {status: components.response(answer) for status, answer in operation.responses.items()}
    for status, meaning in errors.items():
        headers = RETRY_AFTER if status in (429, 503) else {}
        responses[status] = components.response(Answer(meaning, operation.error_model, headers=headers))
    rendered["responses"] = {str(status): responses[status] for status in sorted(responses)}
    return rendered


def build_document(app: Flask, settings: ApiSettings) -> dict[str, Any]:
    components = Components()
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint in NOT_THE_JSON_API:
            continue
        view = app.view_functions[rule.endpoint]
        operation = operation_of(view)
        if operation is None:
            raise UndocumentedRoute(f"{rule.rule} ({rule.endpoint}) declares no operation (api.openapi_operations)")
        path = PATH_ARGUMENT.sub(r"{\1}", rule.rule)
        for method in sorted((rule.methods or set()) - IGNORED_METHODS):
            paths.setdefault(path, {})[method.lower()] = render(app, rule, view.__name__, operation, components)
    with_settings(components.schemas, settings)
    return {
        "openapi": "3.1.0",
        "info": {"title": "stepwise", "version": "1", "description": "Diffusion image generation jobs."},
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": components.schemas,
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "An API key from STEPWISE_API_KEYS."}
            },
        },
        "security": [{"bearerAuth": []}],
    }


def with_settings(schemas: dict[str, Any], settings: ApiSettings) -> None:
    """What this API's settings make of the models' schemas."""
    batch_jobs = schemas["BatchRequest"]["properties"]["jobs"]
    batch_jobs["maxItems"] = settings.max_batch_jobs  # STEPWISE_MAX_BATCH_JOBS
    # Each item is validated on its own and answered in its result (a bad one does not refuse the batch), so
    # any JSON value is a valid item here; what makes it a job is JobRequest.
    batch_jobs["items"] = {
        "description": "A job: the body of POST /v1/jobs (JobRequest). An item that is not a valid job gets its "
        "own 422 in `results`; the others are still taken."
    }
    schemas["JobRequest"]["properties"]["model"]["default"] = settings.default_model  # STEPWISE_MODEL
