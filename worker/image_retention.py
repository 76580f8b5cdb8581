"""Image retention for a local image folder: STEPWISE_IMAGE_TTL, enforced by a sweeper thread.

Every worker process whose image store is a local folder deletes, every `interval`, the images of
jobs whose files are older than the retention (`LocalImageStore.sweep_older_than`). Several workers
sweeping one folder do no harm. An S3 bucket keeps its images by its own lifecycle rule instead
(docs/worker.md shows how to set one), so nothing runs for it here.
"""

from __future__ import annotations

import logging
import threading

from storage.image_store import ImageStore
from storage.local_image_store import LocalImageStore

log = logging.getLogger(__name__)

MAX_INTERVAL_SECONDS = 3600.0


class ImageRetentionSweeper:
    def __init__(self, store: LocalImageStore, ttl_seconds: float) -> None:
        self.store = store
        self.ttl_seconds = ttl_seconds
        self.interval = min(MAX_INTERVAL_SECONDS, max(1.0, ttl_seconds / 4))
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepwise-image-retention", daemon=True)

    @classmethod
    def for_store(cls, store: ImageStore, ttl_seconds: int) -> ImageRetentionSweeper | None:
        if ttl_seconds <= 0 or not isinstance(store, LocalImageStore):
            return None
        return cls(store, ttl_seconds).start()

    def start(self) -> ImageRetentionSweeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def sweep(self) -> int:
        num_deleted = self.store.sweep_older_than(self.ttl_seconds)
        if num_deleted:
            log.info("image retention: deleted the images of %d jobs older than %.0fs", num_deleted, self.ttl_seconds)
        return num_deleted

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.sweep()
            except Exception:  # the sweeper must outlive a folder it cannot read for a moment
                log.exception("image retention sweep failed")
            self._stopped.wait(self.interval)
