"""The API's keys and whom each one names: `KeyRing.caller_for(key)` -> the caller's tenant, and whether it is an
operator (how a request presents its key and what a route asks of it: `api.auth`).

Every environment key is compared in constant time, and all of them are always compared, so neither the timing
nor the order of the variable tells a caller anything; a Redis key is found by its SHA-256 digest.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from storage.api_keys import ApiKeyTable


@dataclass(frozen=True)
class Caller:
    tenant: str
    is_admin: bool  # may read /metrics and every tenant's queue totals
    key_id: str | None = None  # a key kept in Redis (revocable while the API runs); None for the environment's


class KeyRing:
    def __init__(
        self,
        pairs: tuple[tuple[str, str], ...],
        admin_pairs: tuple[tuple[str, str], ...] = (),
        table: ApiKeyTable | None = None,
    ) -> None:
        self._pairs = tuple(
            (Caller(tenant, is_admin), key.encode())
            for is_admin, group in ((False, pairs), (True, admin_pairs))
            for tenant, key in group
        )
        self.table = table

    def caller_for(self, key: str) -> Caller | None:
        presented = key.encode("utf-8", "surrogateescape")
        found = None
        for caller, expected in self._pairs:
            if hmac.compare_digest(presented, expected) and (found is None or caller.is_admin):
                found = caller  # a key in both variables is an operator's
        if found is None and self.table is not None:
            stored = self.table.lookup(key)
            if stored is not None:
                found = Caller(stored.tenant, stored.is_admin, stored.key_id)
        return found

    def tenant_for(self, key: str) -> str | None:
        caller = self.caller_for(key)
        return caller.tenant if caller else None
