"""The spool (worker.spool): what a live worker holds is its own; what a stopped one left is found by the next
worker that looks, once, with its images; the bound says when to stop taking jobs; a job deleted while it waits
leaves it. End to end (real workers, S3 and the local folder down): tests/faults/test_storage_outage.py."""

from __future__ import annotations

import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest

from storage.errors import StorageError
from storage.job_record import JobRecord, JobState, new_job_id
from storage.job_store import JobStore
from storage.settings import StorageSettings
from tests.support.cluster import small_params
from tests.support.job_factories import take_job
from tests.support.waiting import wait_for
from worker.job_ends import end_spooled_job, keep_in_spool
from worker.job_steps import store_or_why
from worker.output_images import OutputImage
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings
from worker.spool import ImageSpool, SpooledJob, default_spool_dir
from worker.spool_uploader import SpoolUploader


def spooled_job(job_id: str, holder: str, data: bytes) -> tuple[SpooledJob, list[OutputImage]]:
    image = OutputImage(f"{job_id}/0.png", data, {"job_id": job_id, "index": "0", "seed": "7"})
    job = SpooledJob(
        job_id, holder, [image.key], [image.metadata], steps=4, timings={"denoise": 0.1}, spooled_at=time.time()
    )
    return job, [image]


def spool_one(spool: ImageSpool, job_id: str, data: bytes = b"\x89PNG fake") -> SpooledJob:
    """As that spool's worker spools its first attempt at `job_id`."""
    job, images = spooled_job(job_id, f"{spool.worker_id}#1", data)
    spool.add(job, images)
    return job


@pytest.fixture
def runtime(redis_url, tmp_path):
    storage = StorageSettings(redis_url=redis_url, storage_url=(tmp_path / "images").as_uri())
    settings = WorkerSettings(storage=storage, spool_dir=str(tmp_path / "spool"), spool_max_bytes=10)
    runtime = WorkerRuntime(settings, "host:1:aaaaaa")
    yield runtime
    runtime.close()


def hold_spooled(
    runtime: WorkerRuntime, record: JobRecord, data: bytes, store_error: str | None = "S3 is down"
) -> None:
    """What a job thread does when the store fails (with `store_error`; None: noted already): its images to the
    spool, the job held there."""
    if store_error is not None:
        runtime.spool.note_error(store_error)
    job, images = spooled_job(record.job_id, record.holder or "", data)
    runtime.spool.add(job, images)
    assert runtime.held.take(record, spooled=job) is not None


def test_a_live_workers_spool_is_left_alone_and_a_stopped_ones_jobs_are_found_once_with_their_images(tmp_path):
    first = ImageSpool(tmp_path, "host:1:aaaaaa")
    job_id = new_job_id()
    spool_one(first, job_id, b"the image")
    other = ImageSpool(tmp_path, "host:2:bbbbbb")
    third = ImageSpool(tmp_path, "host:3:cccccc")

    assert list(other.orphans()) == []  # its worker lives (holds its lock)
    first.close()  # as a killed process's lock goes with it
    for orphan in other.orphans():
        assert (orphan.stopped_worker_id, orphan.job.job_id, orphan.job.holder) == (
            "host:1:aaaaaa",
            job_id,
            "host:1:aaaaaa#1",
        )
        other.move_here(orphan)

    assert [image.data for image in other.images_of(orphan.job)] == [b"the image"]
    assert list(third.orphans()) == []  # moved, not copied: nobody else gets it
    assert not (tmp_path / "host:1:aaaaaa").exists()


def test_a_job_cut_short_before_its_description_was_written_is_dropped_not_adopted(tmp_path):
    first = ImageSpool(tmp_path, "host:1:aaaaaa")
    torn = first.folder / new_job_id()
    torn.mkdir()
    (torn / "0.png").write_bytes(b"half")
    first.close()

    assert list(ImageSpool(tmp_path, "host:2:bbbbbb").orphans()) == []
    assert not torn.exists()


def test_the_spool_has_room_until_it_holds_its_bound_and_again_once_a_job_is_stored(runtime):
    store = runtime.job_store
    records = [store.create(tenant="tests", params=small_params(seed=seed))[0] for seed in (1, 2)]
    taken = [take_job(store, record.job_id, runtime.worker_id) for record in records]
    hold_spooled(runtime, taken[0], b"12345")
    assert runtime.has_spool_room and runtime.spool_stats()["storage_error"] == "S3 is down"
    hold_spooled(runtime, taken[1], b"67890")

    assert not runtime.has_spool_room and runtime.spool_stats()["is_full"] and not runtime.may_take_jobs()
    first, second = runtime.held.spooled()
    SpoolUploader(runtime, lambda *_: "not called")._forget(first)
    assert runtime.has_spool_room and runtime.spool_stats()["num_jobs"] == 1
    assert not (runtime.spool.folder / first.job_id).exists()
    SpoolUploader(runtime, lambda *_: "not called")._forget(second)
    assert runtime.spool_stats() == {
        "num_jobs": 0,
        "num_bytes": 0,
        "max_bytes": 10,
        "is_full": False,
        "storage_error": None,
    }


def test_a_job_deleted_while_its_images_wait_for_storage_leaves_the_spool_at_the_next_look(runtime):
    store = runtime.job_store
    job_ids = [store.create(tenant="tests", params=small_params(seed=seed))[0].job_id for seed in (1, 2)]
    for job_id in job_ids:
        hold_spooled(runtime, take_job(store, job_id, runtime.worker_id, 60), b"x")
    kept, deleted = job_ids
    store.delete(deleted, tombstone_seconds=60)

    assert SpoolUploader(runtime, lambda *_: "not called").drop_ended() == [deleted]
    assert runtime.held.holds(kept) and not runtime.held.holds(deleted)
    assert not (runtime.spool.folder / deleted).exists()
    assert store.get(kept).state is JobState.RUNNING


def test_a_jobs_record_says_it_is_storing_only_once_its_images_are_in_the_spool_and_a_lost_job_leaves_it(
    runtime, monkeypatch
):
    # A worker killed right after its record says "storing" must leave the images for the next worker to adopt.
    store = runtime.job_store
    kept, lost = [
        take_job(store, store.create(tenant="tests", params=small_params(seed=seed))[0].job_id, runtime.worker_id, 60)
        for seed in (1, 2)
    ]
    spooled_when_marked = []
    set_storing = store.set_storing

    def watched_set_storing(job_id: str, *args) -> bool:
        spooled_when_marked.append((runtime.spool.folder / job_id / "job.json").is_file())
        return set_storing(job_id, *args)

    monkeypatch.setattr(store, "set_storing", watched_set_storing)
    store.release(lost.job_id, lost.holder, "worker_drained", "another worker's sweeper re-queued it")

    outcomes = [
        keep_in_spool(runtime, runtime.held.take(record), record, *spooled_job(record.job_id, record.holder, b""), "S3")
        for record in (kept, lost)
    ]

    assert outcomes == ["spooled", "lease lost"]
    assert spooled_when_marked == [True, True]
    assert store.get(kept.job_id).storing_reason == "S3"
    assert (runtime.spool.folder / kept.job_id).is_dir() and not (runtime.spool.folder / lost.job_id).exists()


@pytest.mark.timeout(60)
def test_a_stopped_workers_spooled_job_is_stored_and_ended_while_this_workers_model_still_loads(
    redis_url, tmp_path, monkeypatch
):
    """The uploader starts before the model loads and takes over what a stopped worker left: a model load of
    minutes (a large checkpoint) must not hold those images back (the engine's build has a lock of its own)."""
    images = tmp_path / "images"
    storage = StorageSettings(redis_url=redis_url, storage_url=images.as_uri())
    settings = WorkerSettings(storage=storage, spool_dir=str(tmp_path / "spool"))
    store = JobStore(redis_url)
    record, _ = store.create(tenant="tests", params=small_params())
    taken = take_job(store, record.job_id, "host:1:stopped")
    left = ImageSpool(tmp_path / "spool", "host:1:stopped")
    job, outputs = spooled_job(record.job_id, taken.holder or "", b"the image")
    left.add(job, outputs)
    left.close()  # that worker stopped
    runtime = WorkerRuntime(settings, "host:2:starting")
    is_loading, may_load = threading.Event(), threading.Event()

    def slow_model_load():
        is_loading.set()
        may_load.wait(60)
        raise RuntimeError("this test's model never loads")

    monkeypatch.setattr(runtime, "_build_engine", slow_model_load)
    loader = threading.Thread(target=lambda: pytest.raises(RuntimeError, lambda: runtime.engine), daemon=True)
    loader.start()
    assert is_loading.wait(10)
    uploader = SpoolUploader(runtime, end_spooled_job).start()
    try:
        ended = wait_for(lambda: (r := store.get(record.job_id)).state.is_terminal and r, 20, "the job to end")

        assert (ended.state, ended.attempts) == (JobState.SUCCEEDED, 1) and loader.is_alive()
        assert (images / ended.image_keys[0]).read_bytes() == b"the image"
    finally:
        may_load.set()
        uploader.stop()
        runtime.close()
        store.close()


def test_a_new_spool_is_owner_only_and_the_default_one_is_this_users_not_a_folder_every_user_can_write(
    tmp_path, monkeypatch
):
    spool = ImageSpool(tmp_path / "new" / "spool", "host:1:aaaaaa")
    job_id = new_job_id()
    spool_one(spool, job_id)

    assert stat.S_IMODE((tmp_path / "new" / "spool").stat().st_mode) == 0o700
    assert stat.S_IMODE(spool.folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((spool.folder / job_id).stat().st_mode) == 0o700
    assert {stat.S_IMODE(path.stat().st_mode) for path in (spool.folder / job_id).iterdir()} == {0o600}
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert default_spool_dir() == Path.home() / ".local" / "state" / "stepwise" / "spool"
    assert Path(tempfile.gettempdir()) not in default_spool_dir().parents
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_spool_dir() == tmp_path / "state" / "stepwise" / "spool"


class DownStore:
    """A stand-in for an image store that is down, as S3 failing every retry looks to the worker (the real outages
    run end to end in tests/faults/test_storage_outage.py; this checks only the reason text)."""

    def put_image(self, key, data, metadata):
        raise StorageError("S3 upload of s3://b/x/0.png failed after 5 attempts")


def test_each_waiting_jobs_reason_quotes_the_stores_own_error_once_however_many_wait_before_it(runtime, redis_url):
    runtime._image_store = DownStore()
    store = runtime.job_store
    reasons = []
    for _ in range(3):
        record = take_job(store, store.create(tenant="t", params=small_params())[0].job_id, runtime.worker_id)
        outputs = [OutputImage(f"{record.job_id}/0.png", b"png", {"job_id": record.job_id})]
        reasons.append(store_or_why(runtime, outputs))
        hold_spooled(runtime, record, b"png", store_error=None)

    assert reasons[0] == "S3 upload of s3://b/x/0.png failed after 5 attempts"
    assert reasons[1:] == [
        f"waiting behind {n} spooled jobs for image storage: S3 upload of s3://b/x/0.png failed after 5 attempts"
        for n in (1, 2)
    ]
