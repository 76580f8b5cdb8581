"""The /v1/loras blueprint: a tenant's own LoRA adapters (upload, list, fetch info, delete).

An upload is the raw safetensors file as the request body (`PUT /v1/loras/{name}`), at most
`STEPWISE_LORA_MAX_BYTES`, checked without torch to be a safetensors file whose header tells the
truth and whose LoRA matrices pair up (`core.lora_files`); what needs the weights or the
model (finite values, fitting its layers) is checked by the worker, failing only jobs using it.
It is stored under the tenant's own prefix: only that tenant can use, list, see or delete it;
for another tenant it does not exist. `GET /v1/loras` lists the tenant's uploads and the
operator's adapters, which every tenant may use.
"""

from __future__ import annotations

from typing import Literal

from flask import Blueprint, g, request

from api.answers import LoraList, LoraView
from api.auth import require_tenant
from api.errors import ApiError, invalid, not_found
from api.openapi_operations import BINARY, Answer, api_errors, documented, parameter
from api.resources import get_lora_store, get_settings
from core.errors import LoraFileError
from core.lora_files import check_lora_file
from core.params import LORA_NAME_PATTERN
from storage.lora_store import LoraStore, tenant_key, tenant_slug

bp = Blueprint("loras", __name__, url_prefix="/v1/loras")
bp.before_request(require_tenant)

MAX_NAME_CHARS = 100
LORA_NAME = parameter(
    "name",
    "path",
    "The adapter's name (letters, digits, '_', '.', '-').",
    MAX_NAME_CHARS,
    pattern=f"^{LORA_NAME_PATTERN.pattern}$",
)


def lora_store() -> LoraStore:
    store = get_lora_store()
    if store is None:
        raise ApiError(404, "not_found", "this service has no LoRA store (STEPWISE_LORA_URL is unset)")
    return store


def check_name(name: str) -> str:
    if not LORA_NAME_PATTERN.fullmatch(name):
        raise invalid(
            "name",
            f"name must be letters, digits, '_', '.', '-' (at most 100, starting with a letter "
            f"or digit), got {name[:120]!r}",
        )
    return name


def lora_view(name: str, size: int, owner: Literal["tenant", "operator"]) -> dict:
    return LoraView(name=name, size_bytes=size, owner=owner).model_dump()


@bp.put("/<path:name>")
@documented(
    "Store a LoRA adapter (the raw .safetensors file) usable only by this tenant.",
    body_content={"application/octet-stream": BINARY},
    responses={200: Answer("Replaced.", LoraView), 201: Answer("Stored.", LoraView)},
    errors=api_errors(404, 413, 422, 503),
)
def upload_lora(name: str):
    store, max_bytes = lora_store(), get_settings().storage.lora_max_bytes
    check_name(name)
    request.max_content_length = max_bytes  # this route's own limit, above the JSON routes' one
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(
            413, "payload_too_large", f"a LoRA upload may be at most {max_bytes} bytes (got {request.content_length})"
        )
    data = request.get_data(cache=False)
    if not data:
        raise invalid("body", "the body must be the adapter's .safetensors file (got an empty body)")
    try:
        check_lora_file(data)
    except LoraFileError as e:
        raise invalid("body", f"the body {e}; only safetensors LoRA files are accepted") from e
    existed = store.size(tenant_key(g.tenant, name)) is not None
    store.put(tenant_key(g.tenant, name), data)
    return lora_view(name, len(data), "tenant"), 200 if existed else 201


@bp.get("")
@documented(
    "The adapters this tenant may use: its own uploads and the operator's.",
    responses={200: Answer("The adapters.", LoraList)},
    errors=api_errors(404, 503),
)
def list_loras():
    store = lora_store()
    own = [lora_view(info.name, info.size, "tenant") for info in store.list(f"tenants/{tenant_slug(g.tenant)}")]
    operator = [lora_view(info.name, info.size, "operator") for info in store.list("")]
    return {"loras": own + operator}


@bp.get("/<path:name>")
@documented(
    "One of this tenant's uploaded adapters.",
    responses={200: Answer("The adapter.", LoraView)},
    errors=api_errors(404, 422, 503),
)
def get_lora(name: str):
    store = lora_store()
    size = store.size(tenant_key(g.tenant, check_name(name)))
    if size is None:
        raise not_found("LoRA adapter")
    return lora_view(name, size, "tenant")


@bp.delete("/<path:name>")
@documented(
    "Remove one of this tenant's uploaded adapters.",
    responses={204: Answer("Removed.")},
    errors=api_errors(404, 422, 503),
)
def delete_lora(name: str):
    if not lora_store().delete(tenant_key(g.tenant, check_name(name))):
        raise not_found("LoRA adapter")
    return "", 204
