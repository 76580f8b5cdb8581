"""Names of the job store's Redis keys, the only place they are spelled (lua.py derives its Lua from them)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from storage.job_record import JobRecord, JobState


@dataclass(frozen=True)
class RedisKeys:
    namespace: str

    def job(self, job_id: str) -> str:
        return f"{self.namespace}:job:{job_id}"

    def deleted(self, job_id: str) -> str:
        """A deleted job's tombstone, so a worker still running it cleans up after itself."""
        return f"{self.namespace}:deleted:{job_id}"

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
        """Queued jobs of one model's queue and one priority, by fair-share tag (storage.fair_share)."""
        return f"{self.namespace}:queued:{queue}:{priority}"

    def fair_clock(self, queue: str, priority: str) -> str:
        """Hash: the fair order's virtual clock ("clock") and each tenant's next tag ("tenant:NAME")."""
        return f"{self.namespace}:fair:{queue}:{priority}"

    def queue_of(self, record: JobRecord) -> str:
        """The sorted set a queued record waits in (its position is its rank there)."""
        return self.queued_in(record.queue, record.priority)

    def wake(self, queue: str) -> str:
        """List: wake-up tokens for the workers of one model's queue, one pushed per job queued (storage.lua)."""
        return f"{self.namespace}:wake:{queue}"

    @property
    def leases(self) -> str:
        return f"{self.namespace}:leases"

    @property
    def workers(self) -> str:
        """Hash: worker id -> its latest heartbeat (storage.heartbeats)."""
        return f"{self.namespace}:workers"

    @property
    def workers_seen(self) -> str:
        """Hash: worker id -> its latest heartbeat's seen_at alone, what every worker's dead-worker watch reads
        each second (storage.heartbeats)."""
        return f"{self.namespace}:workers-seen"

    @property
    def api_keys(self) -> str:
        """Hash: SHA-256 digest of an API key -> its record (storage.api_keys)."""
        return f"{self.namespace}:api-keys"

    @property
    def api_key_ids(self) -> str:
        """Hash: API key id -> its digest."""
        return f"{self.namespace}:api-key-ids"

    @property
    def api_key_revocations(self) -> str:
        """Pub/sub channel: the id of each API key just revoked (open streams and waits made with it end)."""
        return f"{self.namespace}:api-key-revocations"

    @property
    def finished_counts(self) -> str:
        return f"{self.namespace}:finished-counts"

    def job_events(self, job_id: str) -> str:
        """Stream: the job's events (storage.job_events), written by the transitions' scripts."""
        return f"{self.namespace}:job-events:{job_id}"

    @property
    def job_events_channel(self) -> str:
        """Pub/sub channel: the id of each job whose event stream just grew."""
        return f"{self.namespace}:job-events"

    def progress_webhook(self, job_id: str) -> str:
        """The webhook id of the job's latest progress delivery (older ones still queued are dropped)."""
        return f"{self.namespace}:progress-webhook:{job_id}"
