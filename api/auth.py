"""API keys: `Authorization: Bearer <key>` -> the caller's tenant, and whether it is an operator.

Keys come from two places: STEPWISE_API_KEYS (and STEPWISE_ADMIN_API_KEYS for operators) in the
environment, and the keys kept hashed in Redis (`storage.api_keys`, managed with `stepwise keys`),
read again at most once a second, so a key created or revoked works or stops within a second
without a restart (`api.keyring` holds them and compares them in constant time). Keys are never logged. A
request that waits (an event stream, `Prefer: wait`, the OpenAI images routes) keeps its Redis key's id
(`g.key_id`), so revoking the key ends it too (api.live).

A header that is there but cannot be read (a value beyond ASCII, which granian hands over empty) is
an invalid key, not a missing one.
"""

from __future__ import annotations

from flask import g, request

from api.errors import ApiError
from api.keyring import Caller, KeyRing
from api.resources import get_keyring

__all__ = ["Caller", "KeyRing", "bearer_token", "require_admin", "require_tenant"]

UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Bearer realm="stepwise"'}


def bearer_token() -> str | None:
    """The presented token; "" for a header that is there but holds no readable token; None without one."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if not header.strip():
        return ""  # sent, but its value did not survive (not ASCII)
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def require_tenant() -> None:
    """before_request hook of the /v1 blueprints: sets g.tenant and g.is_admin, or answers 401."""
    token = bearer_token()
    if token is None:
        raise ApiError(
            401, "unauthorized", "missing API key: send Authorization: Bearer <key>", headers=UNAUTHORIZED_HEADERS
        )
    caller = get_keyring().caller_for(token) if token else None
    if caller is None:
        raise ApiError(401, "unauthorized", "invalid API key", headers=UNAUTHORIZED_HEADERS)
    g.tenant = caller.tenant
    g.is_admin = caller.is_admin
    g.key_id = caller.key_id


def revoked_key_error() -> ApiError:
    """What a request still waiting when its key was revoked gets, as a new request with the key would."""
    return ApiError(
        401, "unauthorized", "the API key of this request was revoked while it waited", headers=UNAUTHORIZED_HEADERS
    )


def require_admin() -> None:
    """For operator routes (/metrics, /v1/admin): an admin key, else 401 (no key) or 403."""
    require_tenant()
    if not g.is_admin:
        raise ApiError(403, "forbidden", "this route needs an admin API key (stepwise keys create --admin)")
