"""Names of the job store's Redis keys, the only place they are spelled (lua.py derives its Lua from them)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from storage.job_record import JobState


@dataclass(frozen=True)
class RedisKeys:
    namespace: str

    def job(self, job_id: str) -> str:
        return f"{self.namespace}:job:{job_id}"

    def tenant_index(self, tenant: str, state: JobState | None = None) -> str:
        """The tenant's jobs in `state`, or all of them; the tenant comes last so no name can collide."""
        return f"{self.namespace}:tenant-jobs:{state.value if state else 'all'}:{tenant}"

    def idempotency(self, tenant: str, key: str) -> str:
        # Quoted, so tenant "a:b" with key "c" and tenant "a" with key "b:c" stay apart.
        return f"{self.namespace}:idem:{quote(tenant, safe='')}:{key}"

    def submit_rate(self, tenant: str, minute: int) -> str:
        """Submissions the tenant made in one wall-clock minute (STEPWISE_TENANT_JOBS_PER_MINUTE)."""
        return f"{self.namespace}:submit-rate:{minute}:{quote(tenant, safe='')}"

    @property
    def queued(self) -> str:
        return f"{self.namespace}:queued"

    def queued_in(self, queue: str, priority: str) -> str:
        """Queued jobs of one model's queue and one priority."""
        return f"{self.namespace}:queued:{queue}:{priority}"

    @property
    def leases(self) -> str:
        return f"{self.namespace}:leases"

    @property
    def workers(self) -> str:
        """Hash: worker id -> its latest heartbeat (storage.heartbeats)."""
        return f"{self.namespace}:workers"

    @property
    def finished_counts(self) -> str:
        return f"{self.namespace}:finished-counts"
