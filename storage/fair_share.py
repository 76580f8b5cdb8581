"""Fair share across tenants at the queue: the order in which a model's queued jobs are taken.

Within one model's queue and one priority, jobs are taken in start-time fair queueing order
(SFQ, Goyal et al. 1996). Each queue and priority keeps a virtual clock `V` (the tag of the job
taken last) and, per tenant, the tag its next job would get `F[t]`. A new job of tenant `t`
gets the tag `max(V, F[t])` and moves `F[t]` on by its share, `cost / weight[t]`; workers take
the job with the smallest tag (`storage.lua.TAKE_NEXT`). So:

- one tenant's jobs keep their submission order (their tags only grow);
- a tenant with nothing queued starts at `V`, level with the job being taken now: its next job is
  taken within about one job of every other tenant's, whatever they have queued;
- over time each busy tenant is served in proportion to its weight, in denoise steps (`cost`
  is the job's planned steps, summed over its images; image size and guidance rows are not in it);
- a job canceled while queued gives its share back (`F[t]` moves back, never below `V`);
- a re-queued job (drain, warm shutdown, a dead worker's lapsed lease) goes back to the head of its
  queue, not behind the backlog: its score is its tag (taken already, so at or before `V`) less its
  share, before every job not taken yet (their tags are at or after `V`).

Weights come from `STEPWISE_TENANT_WEIGHTS` (`tenant:weight,...`; tenants not named weigh 1),
read by every process that creates or re-queues jobs. A job's tag is fixed when it is queued, so a
changed weight applies to jobs queued after the change. The tag is the job's score in its queue's
sorted set: a job's `queue_position` is its rank there, the number of jobs of its model and
priority that will be taken before it unless new jobs are queued ahead of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from core.errors import InvalidParamsError
from core.params import GenerationParams
from settings import SettingsError

MAX_WEIGHT = 1_000_000.0


class TenantWeightsError(SettingsError):
    """STEPWISE_TENANT_WEIGHTS is malformed; the message names the variable."""


@dataclass(frozen=True)
class TenantWeights:
    weights: dict[str, float] = field(default_factory=dict)  # tenant -> weight; tenants not named: 1

    def of(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def share(self, tenant: str, cost: float) -> float:
        """How far one job of `cost` moves its tenant's tag."""
        return cost / self.of(tenant)

    @classmethod
    def parse(cls, text: str) -> TenantWeights:
        """`gold:4,bulk:0.25` -> weights; each weight a positive finite number."""
        weights: dict[str, float] = {}
        for item in text.split(","):
            if not item.strip():
                continue
            tenant, sep, raw = (part.strip() for part in item.rpartition(":"))
            try:
                weight = float(raw)
            except ValueError:
                weight = math.nan
            if not sep or not tenant or not (0 < weight <= MAX_WEIGHT):
                raise TenantWeightsError(
                    f"STEPWISE_TENANT_WEIGHTS must be comma-separated tenant:weight pairs, each weight a number "
                    f"above 0 and at most {MAX_WEIGHT:.0f} (got {item.strip()!r})"
                )
            if tenant in weights:
                raise TenantWeightsError(f"STEPWISE_TENANT_WEIGHTS names tenant {tenant!r} twice")
            weights[tenant] = weight
        return cls(weights)


def queue_cost(params: dict[str, Any]) -> float:
    """A job's cost in the fair order: its planned denoise steps over all its images
    (`GenerationParams.total_steps`); 1 for params that no longer parse (an older record)."""
    try:
        return float(max(1, GenerationParams.from_dict(params).total_steps()))
    except InvalidParamsError:
        return 1.0
