"""The stepwise GPU worker: `celery -A worker worker` (or `stepwise worker`).

Importing this package registers everything the Celery tools need: the tasks
(`stepwise.generate`, `stepwise.deliver_webhook`), the project's inspect and control
commands (`engine_stats`, `drain`, `resume`, and `active` and `revoke` in jobs) and the worker start/stop hooks.

Where things are: `tasks` runs a job on its task thread; `input_images` reads a job's uploads
(input images) for the engine, `output_images` encodes and stores the images it makes;
`generate_messages` sends generate messages (re-queues, the lease sweeper's).
"""

from worker import control, lifecycle, tasks, webhooks  # noqa: F401  (registration)
from worker.app import app

__all__ = ["app"]
