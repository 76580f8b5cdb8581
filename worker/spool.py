"""The spool: finished images the image store could not take, kept on the worker's disk until it does.

A finished image is the most expensive thing the service makes, so a storage outage (S3 unreachable
after its retries, a read-only or full image folder) must not throw it away. When an upload fails,
the job's task thread writes its images here and the job stays `running`, its record saying since
when and why (`JobStore.set_storing`); `worker.spool_uploader` uploads them once the store answers
again and ends the job `succeeded`, once, as any job ends. While anything waits here the store is
taken to be down: new images come straight here instead of each waiting out the store's retries.

Layout, `STEPWISE_SPOOL_DIR`:

    {spool_dir}/{worker_id}/.lock                      held (flock) by that worker process while it lives
    {spool_dir}/{worker_id}/{job_id}/{index}.{format}  the encoded images
    {spool_dir}/{worker_id}/{job_id}/job.json          written last: a folder without it was cut short

A folder whose lock can be taken belongs to a worker that stopped: the worker that takes the lock
adopts its jobs (moves them into its own folder, then `JobStore.adopt`), at its start and every
`ADOPT_INTERVAL` (a spool on shared disk). A job whose spool is lost with its machine is never
reported succeeded without its image: its lease lapses and it runs again.

The bound, `STEPWISE_SPOOL_MAX_BYTES`: once the spool holds that much, `has_room` is False and the
worker takes no new job; jobs already running still finish into it, so it can exceed the bound by
their images. Images are not flushed to disk here (a killed process loses nothing the OS holds; a
machine that loses power re-runs the job).
"""

from __future__ import annotations

import collections
import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from storage.errors import StorageError
from storage.image_store import ImageStore
from worker.output_images import OutputImage, put_images

log = logging.getLogger(__name__)

JOB_FILE = "job.json"
LOCK_FILE = ".lock"


@dataclass
class SpooledJob:
    """What ending a spooled job needs besides its record: written to job.json, read back on adoption."""

    job_id: str
    image_keys: list[str]
    metadata: list[dict[str, str]]  # one per image, as stored with it
    steps: int  # the job's step count (its progress at the end)
    timings: dict[str, float]  # as the task measured them, up to the failed upload
    spooled_at: float  # unix seconds
    num_bytes: int = 0
    in_memory: list[bytes] | None = field(default=None, repr=False)  # the spool's disk failed too: lost if killed

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("in_memory")
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SpooledJob:
        data = json.loads(text)
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


STAGING_PREFIX = ".new-"  # a worker's folder while it takes its lock: never adopted


class ImageSpool:
    """This worker's spool folder, its bound, and the jobs waiting in it (oldest first)."""

    def __init__(self, root: Path, worker_id: str, max_bytes: int) -> None:
        self.root = root
        self.worker_id = worker_id
        self.max_bytes = max_bytes
        self.folder = root / worker_id
        root.mkdir(parents=True, exist_ok=True)
        if self.folder.is_dir():  # this id's folder from before (ids are fresh per start: tools and tests)
            self._lock_file = (self.folder / LOCK_FILE).open("a")
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            # Locked before it is visible under its name: another worker's adoption scan would otherwise find the
            # new folder unlocked in between, take it for a stopped worker's and remove it.
            staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
            self._lock_file = (staging / LOCK_FILE).open("a")
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else sees it yet
            os.rename(staging, self.folder)  # the open lock follows the folder
        self._condition = threading.Condition()
        self._waiting: collections.OrderedDict[str, SpooledJob] = collections.OrderedDict()
        self.num_bytes = 0
        self.last_error: str | None = None  # the image store's latest error while jobs wait

    # what the task threads and the admission check ask

    @property
    def num_jobs(self) -> int:
        return len(self._waiting)

    @property
    def has_room(self) -> bool:
        return self.num_bytes < self.max_bytes

    @property
    def is_backlogged(self) -> bool:
        """Jobs wait here: the store failed lately, so new images come straight here."""
        return bool(self._waiting)

    def holds(self, job_id: str) -> bool:
        return job_id in self._waiting

    def store_or_why(self, image_store: ImageStore, images: list[OutputImage]) -> str | None:
        """Put the images in the store; None if stored, else why not (then they belong in the spool). While jobs
        wait here the store is not tried: it failed lately, and the uploader finds out when it is back."""
        last_error = self.last_error
        if self.is_backlogged:
            return f"waiting behind {self.num_jobs} spooled jobs for image storage: {last_error}"
        try:
            put_images(image_store, images)
        except StorageError as e:
            return str(e) or type(e).__name__
        return None

    def wait_for_room(self, timeout: float) -> bool:
        with self._condition:
            return self._condition.wait_for(lambda: self.has_room, timeout)

    def stats(self) -> dict[str, object]:
        """What engine_stats and the heartbeat say of it."""
        return {
            "num_jobs": self.num_jobs,
            "num_bytes": self.num_bytes,
            "max_bytes": self.max_bytes,
            "is_full": not self.has_room,
            "storage_error": self.last_error if self._waiting else None,
        }

    # writing and removing

    def add(self, job: SpooledJob, images: list[OutputImage], why: str) -> None:
        """Keep the job's images until the store takes them. If the spool's own disk fails too, they are kept
        in memory (a process killed meanwhile loses them, and the job runs again)."""
        job.num_bytes = sum(len(image.data) for image in images)
        folder = self.folder / job.job_id
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for image in images:
                (folder / file_name(image.key)).write_bytes(image.data)
            temporary = folder / f".{JOB_FILE}.tmp"
            temporary.write_text(job.to_json())
            os.replace(temporary, folder / JOB_FILE)
        except OSError as e:
            log.error("job %s: the spool %s cannot take its images either (%s): kept in memory", job.job_id, folder, e)
            shutil.rmtree(folder, ignore_errors=True)
            job.in_memory = [image.data for image in images]
        with self._condition:
            self.last_error = why
            self._add_waiting(job)

    def _add_waiting(self, job: SpooledJob) -> None:
        self._waiting[job.job_id] = job
        self.num_bytes += job.num_bytes
        self._condition.notify_all()

    def remove(self, job_id: str) -> None:
        """The job's images are stored (or no longer wanted): forget them."""
        with self._condition:
            job = self._waiting.pop(job_id, None)
            if job is not None:
                self.num_bytes -= job.num_bytes
            if not self._waiting:
                self.last_error = None
            self._condition.notify_all()
        shutil.rmtree(self.folder / job_id, ignore_errors=True)

    def note_error(self, why: str) -> None:
        self.last_error = why

    def images_of(self, job: SpooledJob) -> list[OutputImage]:
        if job.in_memory is not None:
            data = job.in_memory
        else:
            folder = self.folder / job.job_id
            data = [(folder / file_name(key)).read_bytes() for key in job.image_keys]
        parts = zip(job.image_keys, data, job.metadata, strict=True)
        return [OutputImage(key, item, metadata) for key, item, metadata in parts]

    def waiting(self) -> list[SpooledJob]:
        """The jobs waiting, oldest first."""
        with self._condition:
            return list(self._waiting.values())

    def wait_for_jobs(self, timeout: float) -> bool:
        with self._condition:
            return self._condition.wait_for(lambda: bool(self._waiting), timeout)

    # what stopped workers left

    def adopt_orphans(self) -> Iterator[tuple[str, SpooledJob]]:
        """Move each job a stopped worker left in the spool into this worker's folder; yields (that worker's id,
        the job). The caller takes the job over in the job store, or removes it (`remove`)."""
        for folder in sorted(self.root.iterdir()):
            if folder == self.folder or not folder.is_dir() or folder.name.startswith(STAGING_PREFIX):
                continue
            with _lock_of_stopped_worker(folder) as is_stopped:
                if not is_stopped:
                    continue
                for job_folder in sorted(folder.iterdir()):
                    job = self._move_here(job_folder)
                    if job is not None:
                        yield folder.name, job
                shutil.rmtree(folder, ignore_errors=True)

    def _move_here(self, job_folder: Path) -> SpooledJob | None:
        if not job_folder.is_dir():
            return None
        try:
            job = SpooledJob.from_json((job_folder / JOB_FILE).read_text())
            os.replace(job_folder, self.folder / job.job_id)
        except (OSError, ValueError, TypeError, KeyError) as e:  # cut short before job.json, or torn
            log.warning("spool: dropping %s, left incomplete by a stopped worker (%s)", job_folder, e)
            return None
        with self._condition:
            self._add_waiting(job)
        return job

    def close(self) -> None:
        """Release the lock: what is left here is adopted by the next worker that looks."""
        self._lock_file.close()


class _lock_of_stopped_worker:
    """Context manager: True (holding its lock) if the worker whose spool folder this is has stopped."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_FILE
        self.file: TextIO | None = None

    def __enter__(self) -> bool:
        try:
            self.file = file = self.path.open("a")
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: that worker lives (or the folder went meanwhile)
            return False
        return True

    def __exit__(self, *exc_info: object) -> None:
        if self.file is not None:
            self.file.close()


def file_name(key: str) -> str:
    """An image's file in its job's spool folder: the key's last part, `{index}.{format}`, unique within the job."""
    return key.rsplit("/", 1)[-1]


def default_spool_dir() -> Path:
    return Path(tempfile.gettempdir()) / "stepwise-spool"


def open_spool(spool_dir: str | None, worker_id: str, max_bytes: int) -> ImageSpool:
    root = Path(spool_dir).expanduser().resolve() if spool_dir else default_spool_dir()
    return ImageSpool(root, worker_id, max_bytes)
