"""STEPWISE_IMAGE_TTL for a local folder: the worker's sweeper deletes old jobs' images and keeps new ones;
nothing runs for S3 (its bucket's lifecycle rule) or a retention of 0 (keep for ever)."""

from __future__ import annotations

import os
import time

from storage.local_image_store import LocalImageStore
from worker.image_retention import ImageRetentionSweeper


def test_the_sweeper_deletes_images_older_than_the_retention_and_only_those(tmp_path):
    store = LocalImageStore(tmp_path / "images")
    for job_id in ("old", "new"):
        store.put_image(store.key_for(job_id, 0), b"png", {})
    two_hours_ago = time.time() - 7200
    for path in (tmp_path / "images" / "old").iterdir():
        os.utime(path, (two_hours_ago, two_hours_ago))
    sweeper = ImageRetentionSweeper(store, ttl_seconds=3600)

    assert sweeper.sweep() == 1
    assert not store.exists(store.key_for("old", 0)) and store.exists(store.key_for("new", 0))
    assert sweeper.interval == 900  # a quarter of the retention, at most an hour


def test_no_sweeper_runs_for_a_retention_of_zero_or_a_store_that_is_not_a_folder(tmp_path):
    assert ImageRetentionSweeper.for_store(LocalImageStore(tmp_path / "images"), 0) is None
    assert ImageRetentionSweeper.for_store(object(), 3600) is None  # S3: the bucket's lifecycle rule
