"""The spool: finished images the image store could not take, kept on the worker's disk until it does.

A finished image is the most expensive thing the service makes, so a storage outage (S3 unreachable
after its retries, a read-only or full image folder) must not throw it away. When an upload fails,
the job's thread writes its images here and the job stays `running`, its record saying since
when and why (`JobStore.set_storing`); `worker.spool_uploader` uploads them once the store answers
again and ends the job `succeeded`, once, as any job ends. While anything waits here the store is
taken to be down: new images come straight here instead of each waiting out the store's retries.
Which jobs wait here is the held-jobs book's to say (`worker.held_jobs`, `Stage.SPOOLED`); this module
is the disk.

Layout, `STEPWISE_SPOOL_DIR`:

    {spool_dir}/{worker_id}/.lock                      held (flock) by that worker process while it lives
    {spool_dir}/{worker_id}/{job_id}/{index}.{format}  the encoded images
    {spool_dir}/{worker_id}/{job_id}/job.json          written last: a folder without it was cut short

A folder whose lock can be taken belongs to a worker that stopped: the worker that takes the lock
adopts its jobs (`orphans`: each is taken over in the job store, `JobStore.adopt`, then moved into its
own folder), at its start and every `ADOPT_INTERVAL` (a spool on shared disk). A job whose spool is lost
with its machine is never reported succeeded without its image: its lease lapses and it runs again.

The bound, `STEPWISE_SPOOL_MAX_BYTES`, is the runtime's (`WorkerRuntime.has_spool_room`). Images are not
flushed to disk here (a killed process loses nothing the OS holds; a machine that loses power re-runs the job).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from worker.output_images import OutputImage

log = logging.getLogger(__name__)

JOB_FILE = "job.json"
LOCK_FILE = ".lock"


@dataclass
class SpooledJob:
    """What ending a spooled job needs besides its record: written to job.json, read back on adoption."""

    job_id: str
    holder: str  # the attempt that spooled it (`worker_id#attempt`): an adopter takes the job over from it
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


@dataclass
class Orphan:
    """A job a stopped worker left in the spool, found by `ImageSpool.orphans`."""

    folder: Path  # its job folder, in the stopped worker's folder
    stopped_worker_id: str
    job: SpooledJob


class ImageSpool:
    """This worker's spool folder, and what stopped workers left beside it."""

    def __init__(self, root: Path, worker_id: str) -> None:
        self.root = root
        self.worker_id = worker_id
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
        self.last_error: str | None = None  # the image store's latest error while jobs wait

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
        self.last_error = why

    def remove(self, job_id: str) -> None:
        """The job's images are stored (or no longer wanted): remove them."""
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

    # what stopped workers left

    def orphans(self) -> Iterator[Orphan]:
        """Each job a stopped worker left in the spool, its worker's lock held while the caller handles it (takes it
        over and `move_here`, or `discard`s it). A stopped worker's folder goes once nothing is left in it."""
        for folder in sorted(self.root.iterdir()):
            if folder == self.folder or not folder.is_dir() or folder.name.startswith(STAGING_PREFIX):
                continue
            with _lock_of_stopped_worker(folder) as is_stopped:
                if not is_stopped:
                    continue
                for job_folder in sorted(folder.iterdir()):
                    job = self._read_left(job_folder)
                    if job is not None:
                        yield Orphan(job_folder, folder.name, job)
                if not [path for path in folder.iterdir() if path.name != LOCK_FILE]:
                    shutil.rmtree(folder, ignore_errors=True)

    def _read_left(self, job_folder: Path) -> SpooledJob | None:
        if not job_folder.is_dir():
            return None
        try:
            return SpooledJob.from_json((job_folder / JOB_FILE).read_text())
        except (OSError, ValueError, TypeError, KeyError) as e:  # cut short before job.json, or torn
            log.warning("spool: dropping %s, left incomplete by a stopped worker (%s)", job_folder, e)
            shutil.rmtree(job_folder, ignore_errors=True)
            return None

    def move_here(self, orphan: Orphan) -> None:
        """Into this worker's folder (raises OSError)."""
        os.replace(orphan.folder, self.folder / orphan.job.job_id)

    def discard(self, orphan: Orphan) -> None:
        shutil.rmtree(orphan.folder, ignore_errors=True)

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


def open_spool(spool_dir: str | None, worker_id: str) -> ImageSpool:
    root = Path(spool_dir).expanduser().resolve() if spool_dir else default_spool_dir()
    return ImageSpool(root, worker_id)
