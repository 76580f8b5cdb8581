"""The stepwise GPU worker: `celery -A worker worker` (or `stepwise worker`).

Importing this package registers everything the Celery tools need: the one Celery task
(`stepwise.deliver_webhook`; jobs are not Celery tasks), the project's inspect and control
commands (`engine_stats`, `drain`, `resume`, and `active` and `revoke` in jobs) and the worker start/stop hooks.

Where things are: `feeder` takes jobs from the model's queue whenever the engine has room, `held_jobs` is the
book of every job the worker holds, and `tasks` runs each on a thread of its own; `input_images` reads a job's
uploads (input images) for the engine, `output_images` encodes and stores the images it makes.
"""

from worker import control, lifecycle, webhooks  # noqa: F401  (registration)
from worker.app import app

__all__ = ["app"]
