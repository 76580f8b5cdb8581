"""Celery task and queue names, shared by the API (which sends) and the worker (which consumes).

Each model has its own generate queue, so a worker takes only jobs for the model it serves. The
queue name is derived from the model name: a readable slug of it plus a hash of the whole name, so
any characters a model name may hold (slashes, colons, spaces, unicode) give a safe, distinct name.

Priority is kombu's: the Redis transport keeps one list per priority step of a queue and pops the
lists in step order, so a higher-priority message is delivered before every lower one already
waiting in that queue (step 0 first). Messages sent without a priority get the normal one
(`task_default_priority`), never the high one.
"""

from __future__ import annotations

import hashlib
import re

from core.params import PRIORITIES

GENERATE_TASK = "stepwise.generate"
WEBHOOK_TASK = "stepwise.deliver_webhook"
WEBHOOK_QUEUE = "stepwise.webhooks"
GENERATE_QUEUE_PREFIX = "stepwise.generate"
# `-Q stepwise.generate` on a worker means "the generate queue of the model I serve".
GENERATE_QUEUE_ALIAS = GENERATE_QUEUE_PREFIX

PRIORITY_STEPS = [0, 3, 6, 9]  # kombu's Redis priority lists; step 0 is popped first
BROKER_PRIORITY = {name: PRIORITY_STEPS[index] for index, name in enumerate(PRIORITIES)}  # high 0, normal 3, low 6
DEFAULT_PRIORITY = "normal"

MAX_SLUG_CHARS = 40


def generate_queue(model: str) -> str:
    """`builtin:tiny` -> `stepwise.generate.builtin-tiny-1f2e3d4c5b`; stable across processes and versions."""
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[:MAX_SLUG_CHARS].strip("-") or "model"
    digest = hashlib.sha256(model.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{GENERATE_QUEUE_PREFIX}.{slug}-{digest}"


def broker_queue_keys(queue: str) -> list[str]:
    """The Redis lists kombu keeps for `queue`, one per priority step (for counting what waits)."""
    return [queue if step == 0 else f"{queue}\x06\x16{step}" for step in PRIORITY_STEPS]


def celery_transport_options() -> dict:
    """What the API's producer and the worker's consumer must agree on."""
    return {"priority_steps": PRIORITY_STEPS}
