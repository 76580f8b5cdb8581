"""The OpenAPI 3.1 document served at GET /openapi.json, built from the same pydantic
models that validate requests, so the document cannot drift from the code."""

from __future__ import annotations

from typing import Any

from flask import Blueprint
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode

from api import schemas
from api.jobs import MAX_JOB_ID_CHARS
from api.openapi_live import add_live_paths
from api.resources import get_openapi_document
from api.settings import ApiSettings
from api.submission import MAX_IDEMPOTENCY_KEY_CHARS
from core.params import LORA_NAME_PATTERN

bp = Blueprint("openapi", __name__)

REF = "#/components/schemas/{model}"
ERROR = schemas.ErrorResponse


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


# `batch` is no job id: GET /v1/jobs/batch is the batch route's 405 (api.jobs.JobIdConverter).
JOB_ID = parameter("job_id", "path", "The job's id.", MAX_JOB_ID_CHARS, pattern=r"^(?!batch$)[^/]+$")
IDEMPOTENCY_KEY = parameter(
    "Idempotency-Key",
    "header",
    "Retries with the same key and body return the original job; the same key with another body gets 409.",
    MAX_IDEMPOTENCY_KEY_CHARS,
    pattern=r"^[ -~]*[!-~][ -~]*$",  # printable ASCII, not only spaces (api.submission.check_idempotency_key)
    required=False,
)
LORA_NAME = parameter(
    "name",
    "path",
    "The adapter's name (letters, digits, '_', '.', '-').",
    100,
    pattern=f"^{LORA_NAME_PATTERN.pattern}$",
)
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}}


class DocumentBuilder:
    models = schemas
    job_id = JOB_ID

    def __init__(self) -> None:
        self.components: dict[str, Any] = {}

    def ref(self, model: type[BaseModel], mode: JsonSchemaMode = "serialization") -> dict[str, str]:
        schema = model.model_json_schema(ref_template=REF, mode=mode)
        self.components.update(schema.pop("$defs", {}))
        self.components[model.__name__] = schema
        return {"$ref": REF.format(model=model.__name__)}

    def json_body(self, model: type[BaseModel]) -> dict[str, Any]:
        return {"required": True, "content": {"application/json": {"schema": self.ref(model, "validation")}}}

    def response(
        self, description: str, model: type[BaseModel] | None = None, headers: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        answer: dict[str, Any] = {"description": description}
        if model is not None:
            answer["content"] = {"application/json": {"schema": self.ref(model)}}
        if headers:
            answer["headers"] = headers
        return answer

    def errors(self, *statuses: int) -> dict[str, Any]:
        meanings = {
            400: "Malformed JSON.",
            401: "Missing or invalid API key.",
            403: "The API key is not an admin key.",
            404: "No such job (or upload, or adapter) for this key; for /v1/loras also: no LoRA store.",
            409: "Conflict with the job's state or an earlier request.",
            413: "Request body too large.",
            415: "The body is not sent as JSON (Content-Type: application/json).",
            422: "A field is invalid; `error.field` names it.",
            429: "The queue, the tenant's queued jobs or its jobs per minute are at their limit.",
            503: "Redis, storage or the queue is unavailable.",
        }
        return {
            str(status): self.response(meanings[status], ERROR, RETRY_AFTER if status in (429, 503) else None)
            for status in statuses
        }


def query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """A query model's fields as OpenAPI parameters (a query string cannot carry null)."""
    parameters = []
    for name, schema in model.model_json_schema(mode="validation")["properties"].items():
        options = [option for option in schema.pop("anyOf", []) if option.get("type") != "null"]
        if options:
            schema.update(options[0])
        if schema.get("default") is None:
            schema.pop("default", None)
        parameters.append(
            {
                "name": name,
                "in": "query",
                "required": False,
                "description": schema.pop("description", ""),
                "schema": schema,
            }
        )
    return parameters


def build_document(settings: ApiSettings) -> dict[str, Any]:
    b = DocumentBuilder()
    job = b.response("The job.", schemas.JobView)
    paths = {
        "/v1/jobs": {
            "post": {
                "operationId": "submitJob",
                "summary": "Submit a generation job.",
                "parameters": [IDEMPOTENCY_KEY],
                "requestBody": b.json_body(schemas.JobRequest),
                "responses": {
                    "202": b.response("Queued (or the original job, for a replayed Idempotency-Key).", schemas.JobView),
                    **b.errors(400, 401, 409, 413, 415, 422, 429, 503),
                },
            },
            "get": {
                "operationId": "listJobs",
                "summary": "The caller's jobs, newest first.",
                "parameters": query_parameters(schemas.ListQuery),
                "responses": {"200": b.response("A page of jobs.", schemas.JobList), **b.errors(401, 422, 503)},
            },
        },
        "/v1/jobs/batch": {
            "post": {
                "operationId": "submitBatch",
                "summary": f"Submit up to {settings.max_batch_jobs} jobs; each item gets its own result.",
                "parameters": [IDEMPOTENCY_KEY],
                "requestBody": b.json_body(schemas.BatchRequest),
                "responses": {
                    "200": b.response("One result per item.", schemas.BatchResponse),
                    **b.errors(400, 401, 413, 415, 422, 429, 503),
                },
            },
        },
        "/v1/uploads": {
            "post": {
                "operationId": "uploadImage",
                "summary": "Store an input image (init_image, mask_image) for the caller's tenant; expires like jobs.",
                "requestBody": {
                    "required": True,
                    "content": {
                        **{
                            content_type: {"schema": {"type": "string", "format": "binary"}}
                            for content_type in ("image/png", "image/jpeg", "image/webp")
                        },
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "required": ["file"],
                                "properties": {"file": {"type": "string", "format": "binary"}},
                            }
                        },
                    },
                },
                "responses": {
                    "201": b.response("Stored; name its id in init_image or mask_image.", schemas.UploadView),
                    **b.errors(401, 413, 422, 503),
                },
            },
        },
        "/v1/loras": {
            "get": {
                "operationId": "listLoras",
                "summary": "The adapters this tenant may use: its own uploads and the operator's.",
                "responses": {"200": b.response("The adapters.", schemas.LoraList), **b.errors(401, 404, 503)},
            },
        },
        "/v1/loras/{name}": {
            "put": {
                "operationId": "uploadLora",
                "summary": "Store a LoRA adapter (the raw .safetensors file) usable only by this tenant.",
                "parameters": [LORA_NAME],
                "requestBody": {
                    "required": True,
                    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                },
                "responses": {
                    "200": b.response("Replaced.", schemas.LoraView),
                    "201": b.response("Stored.", schemas.LoraView),
                    **b.errors(401, 404, 413, 422, 503),
                },
            },
            "get": {
                "operationId": "getLora",
                "summary": "One of this tenant's uploaded adapters.",
                "parameters": [LORA_NAME],
                "responses": {"200": b.response("The adapter.", schemas.LoraView), **b.errors(401, 404, 422, 503)},
            },
            "delete": {
                "operationId": "deleteLora",
                "summary": "Remove one of this tenant's uploaded adapters.",
                "parameters": [LORA_NAME],
                "responses": {"204": {"description": "Removed."}, **b.errors(401, 404, 422, 503)},
            },
        },
        "/v1/jobs/{job_id}": {
            "get": {
                "operationId": "getJob",
                "summary": "A job's state, progress, timings and image URL.",
                "parameters": [JOB_ID],
                "responses": {"200": job, **b.errors(401, 404, 503)},
            },
            "delete": {
                "operationId": "deleteJob",
                "summary": "Remove the job's record and images (a queued or running job is canceled first).",
                "parameters": [JOB_ID],
                "responses": {"204": {"description": "Deleted."}, **b.errors(401, 404, 503)},
            },
        },
        "/v1/jobs/{job_id}/cancel": {
            "post": {
                "operationId": "cancelJob",
                "summary": "Cancel: a queued job at once, a running one at its next step.",
                "parameters": [JOB_ID],
                "responses": {
                    "200": b.response("Canceled.", schemas.JobView),
                    "202": b.response("Cancel requested; the running job stops at its next step.", schemas.JobView),
                    **b.errors(401, 404, 409, 503),
                },
            },
        },
        "/v1/jobs/{job_id}/image": {
            "get": {
                "operationId": "getJobImage",
                "summary": "The image in the job's output_format (local storage) or a redirect to it (S3).",
                "parameters": [JOB_ID, *query_parameters(schemas.ImageQuery)],
                "responses": {
                    "200": {
                        "description": "The image.",
                        "content": {
                            content_type: {"schema": {"type": "string", "format": "binary"}}
                            for content_type in ("image/png", "image/jpeg", "image/webp")
                        },
                    },
                    "302": {
                        "description": "Redirect to a presigned URL.",
                        "headers": {"Location": {"schema": {"type": "string"}}},
                    },
                    **b.errors(401, 404, 409, 422, 503),
                },
            },
        },
        "/v1/models": {
            "get": {
                "operationId": "listModels",
                "summary": "The models workers serve (from their heartbeats), with queue depth and engine statistics.",
                "responses": {"200": b.response("Served models, by name.", schemas.ModelList), **b.errors(401, 503)},
            },
        },
        "/v1/admin/tenants": {
            "get": {
                "operationId": "tenantTotals",
                "summary": "Every tenant's queued and running jobs (an admin API key).",
                "responses": {
                    "200": b.response("Per tenant.", schemas.TenantTotalsList),
                    **b.errors(401, 403, 503),
                },
            },
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "The process is alive.",
                "security": [],
                "responses": {"200": b.response("Alive.", schemas.Health)},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Redis and image storage are reachable; says whether workers run.",
                "security": [],
                "responses": {
                    "200": b.response("Ready.", schemas.Readiness),
                    "503": b.response("Not ready.", schemas.Readiness),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (an admin API key).",
                "responses": {
                    "200": {
                        "description": "Prometheus text format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **b.errors(401, 403),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1.",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    }
    add_live_paths(b, paths)
    batch_jobs = b.components["BatchRequest"]["properties"]["jobs"]
    batch_jobs["maxItems"] = settings.max_batch_jobs
    # Each item is validated on its own and answered in its result (a bad one does not refuse the batch), so
    # any JSON value is a valid item here; what makes it a job is JobRequest.
    batch_jobs["items"] = {
        "description": "A job: the body of POST /v1/jobs (JobRequest). An item that is not a valid job gets its "
        "own 422 in `results`; the others are still taken."
    }
    b.components["JobRequest"]["properties"]["model"]["default"] = settings.default_model  # STEPWISE_MODEL
    return {
        "openapi": "3.1.0",
        "info": {"title": "stepwise", "version": "1", "description": "Diffusion image generation jobs."},
        "paths": paths,
        "components": {
            "schemas": b.components,
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "An API key from STEPWISE_API_KEYS."}
            },
        },
        "security": [{"bearerAuth": []}],
    }


@bp.get("/openapi.json")
def openapi_json():
    return get_openapi_document()
