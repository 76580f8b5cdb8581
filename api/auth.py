"""API keys: `Authorization: Bearer <key>` -> the key's tenant.

Every configured key is compared in constant time, and all of them are always compared,
so neither the timing nor the order of STEPWISE_API_KEYS tells a caller anything.
Keys are never logged.
"""

from __future__ import annotations

import hmac

from flask import g, request

from api.errors import ApiError
from api.resources import get_keyring

UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Bearer realm="stepwise"'}


class KeyRing:
    def __init__(self, pairs: tuple[tuple[str, str], ...]) -> None:
        self._pairs = tuple((tenant, key.encode()) for tenant, key in pairs)

    def tenant_for(self, key: str) -> str | None:
        presented = key.encode("utf-8", "surrogateescape")
        found = None
        for tenant, expected in self._pairs:
            if hmac.compare_digest(presented, expected) and found is None:
                found = tenant
        return found


def bearer_token() -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def require_tenant() -> None:
    """before_request hook of the /v1 blueprint: sets g.tenant or answers 401."""
    token = bearer_token()
    if token is None:
        raise ApiError(
            401, "unauthorized", "missing API key: send Authorization: Bearer <key>", headers=UNAUTHORIZED_HEADERS
        )
    tenant = get_keyring().tenant_for(token)
    if tenant is None:
        raise ApiError(401, "unauthorized", "invalid API key", headers=UNAUTHORIZED_HEADERS)
    g.tenant = tenant
