"""The spool: finished images the image store could not take, kept on the worker's disk until it does.

A finished image is the most expensive thing the service makes, so a storage outage (S3 unreachable
after its retries, a read-only or full image folder) must not throw it away. When an upload fails,
the job's thread writes its images here and the job stays `running`, its record saying since
when and why (`JobStore.set_storing`); `worker.spool_uploader` uploads them once the store answers
again and ends the job `succeeded`, once, as any job ends. While anything waits here the store is
taken to be down: new images come straight here instead of each waiting out the store's retries.
Which jobs wait here is the held-jobs book's to say (`worker.held_jobs`, `Stage.SPOOLED`); this module
is the disk.

Layout, `STEPWISE_SPOOL_DIR` (default: `stepwise/spool` in this user's state folder, `$XDG_STATE_HOME` or
`~/.local/state`; never a folder every user can write, such as /tmp):

    {spool_dir}/{worker_id}/.lock                      held (flock) by that worker process while it lives
    {spool_dir}/{worker_id}/{job_id}/{index}.{format}  the encoded images
    {spool_dir}/{worker_id}/{job_id}/job.json          written last: a folder without it was cut short

It trusts nothing it did not write (`worker.spool_files`): its folders are this user's and owner-only, a spool
folder another user owns or can write is refused (the worker does not start), and files are read without
following links. A folder whose lock can be taken belongs to a worker that stopped: the worker that takes the
lock adopts its jobs (`orphans`), at its start and every `ADOPT_INTERVAL` (a spool on shared disk), each only if
its folder is named by a job id, its job.json names that id and the attempt (of that stopped worker) that
spooled it, and every file in it is a regular file; the uploader then takes the job over in the job store only
from that attempt (`JobStore.adopt`) before moving it into its own folder. What fails a check is logged and
removed from the spool (never anything outside it). A job whose spool is lost with its machine is never
reported succeeded without its image: its lease lapses and it runs again.

The bound, `STEPWISE_SPOOL_MAX_BYTES`, is the runtime's (`WorkerRuntime.has_spool_room`). Images are not
flushed to disk here (a killed process loses nothing the OS holds; a machine that loses power re-runs the job).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from storage.job_record import is_job_id, worker_of
from worker.output_images import OutputImage
from worker.spool_files import (
    FOLDER_MODE,
    MAX_DESCRIPTION_BYTES,
    open_folder,
    open_lock,
    private_folder,
    read_regular,
    remove_folder,
    unsafe_because,
    write_private,
)

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
        """Read back what `to_json` wrote; ValueError naming the field for anything else."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        checks = {
            "job_id": lambda v: isinstance(v, str),
            "holder": lambda v: isinstance(v, str),
            "image_keys": lambda v: isinstance(v, list) and all(isinstance(k, str) for k in v),
            "metadata": lambda v: (
                isinstance(v, list)
                and all(isinstance(m, dict) and all(isinstance(x, str) for x in (*m, *m.values())) for m in v)
            ),
            "steps": lambda v: isinstance(v, int),
            "timings": lambda v: isinstance(v, dict) and all(isinstance(x, int | float) for x in v.values()),
            "spooled_at": lambda v: isinstance(v, int | float),
        }
        for name, is_valid in checks.items():
            if name not in data or not is_valid(data[name]):
                raise ValueError(f"{JOB_FILE}: {name} is missing or malformed")
        if len(data["metadata"]) != len(data["image_keys"]):
            raise ValueError(f"{JOB_FILE}: metadata does not match image_keys")
        return cls(**{name: data[name] for name in checks})


STAGING_PREFIX = ".new-"  # a worker's folder while it takes its lock: never adopted
IMAGE_FILE_PATTERN = re.compile(r"[0-9]+\.[a-z0-9]+")  # `{index}.{format}`: what file_name gives a stored key


@dataclass
class Orphan:
    """A job a stopped worker left in the spool, found by `ImageSpool.orphans` and checked there."""

    folder: Path  # its job folder, in the stopped worker's folder
    stopped_worker_id: str
    job: SpooledJob


class ImageSpool:
    """This worker's spool folder, and what stopped workers left beside it."""

    def __init__(self, root: Path, worker_id: str) -> None:
        self.root = private_folder(root)
        self.worker_id = worker_id
        self.folder = root / worker_id
        if os.path.lexists(self.folder):  # this id's folder from before (ids are fresh per start: tools and tests)
            private_folder(self.folder, what="this worker's spool folder")
            self._lock = open_lock(self.folder, LOCK_FILE)
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            # Locked before it is visible under its name: another worker's adoption scan would otherwise find the
            # new folder unlocked in between, take it for a stopped worker's and remove it. mkdtemp makes it 0700.
            staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
            self._lock = open_lock(staging, LOCK_FILE)
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else sees it yet
            os.rename(staging, self.folder)  # the open lock follows the folder
        self.last_error: str | None = None  # the image store's latest error while jobs wait

    def add(self, job: SpooledJob, images: list[OutputImage]) -> None:
        """Keep the job's images until the store takes them (the store's error is `note_error`'s, not this job's
        reason, which may only say it waits behind others). If the spool's own disk fails too, they are kept
        in memory (a process killed meanwhile loses them, and the job runs again)."""
        job.num_bytes = sum(len(image.data) for image in images)
        folder = self._job_folder(job.job_id)
        try:
            folder.mkdir(mode=FOLDER_MODE, exist_ok=True)
            for image in images:
                write_private(folder, file_name(image.key), image.data)
            write_private(folder, f".{JOB_FILE}.tmp", job.to_json().encode())
            os.replace(folder / f".{JOB_FILE}.tmp", folder / JOB_FILE)
        except OSError as e:
            log.error("job %s: the spool %s cannot take its images either (%s): kept in memory", job.job_id, folder, e)
            remove_folder(folder)
            job.in_memory = [image.data for image in images]

    def remove(self, job_id: str) -> None:
        """The job's images are stored (or no longer wanted): remove them."""
        remove_folder(self._job_folder(job_id))

    def note_error(self, why: str) -> None:
        self.last_error = why

    def images_of(self, job: SpooledJob) -> list[OutputImage]:
        """The job's images, read without following links (OSError if one is not a regular file here)."""
        if job.in_memory is not None:
            data = job.in_memory
        else:
            folder_fd = open_folder(self._job_folder(job.job_id))
            try:
                data = [read_regular(folder_fd, file_name(key)) for key in job.image_keys]
            finally:
                os.close(folder_fd)
        parts = zip(job.image_keys, data, job.metadata, strict=True)
        return [OutputImage(key, item, metadata) for key, item, metadata in parts]

    def _job_folder(self, job_id: str) -> Path:
        if not is_job_id(job_id):  # a path would name a folder outside the spool
            raise ValueError(f"not a job id: {job_id!r}")
        return self.folder / job_id

    # what stopped workers left

    def orphans(self) -> Iterator[Orphan]:
        """Each job a stopped worker left in the spool that passes every check (`_check_left`), its worker's lock
        held while the caller handles it (takes it over and `move_here`, or `discard`s it). What fails a check is
        logged and removed; a stopped worker's folder goes once nothing is left in it. A folder that is not a real
        folder of this user's that only it can write is left alone (and logged): it is not the spool's."""
        for folder in sorted(self.root.iterdir()):
            if folder == self.folder or folder.name.startswith(STAGING_PREFIX):
                continue
            why = unsafe_because(folder)
            if why is not None:
                log.warning("spool: not looking into %s: it %s", folder, why)
                continue
            with _lock_of_stopped_worker(folder) as is_stopped:
                if not is_stopped:
                    continue
                for job_folder in sorted(folder.iterdir()):
                    if job_folder.name == LOCK_FILE:
                        continue
                    job = self._check_left(job_folder, folder.name)
                    if job is not None:
                        yield Orphan(job_folder, folder.name, job)
                if [path.name for path in folder.iterdir()] in ([], [LOCK_FILE]):
                    remove_folder(folder)

    def _check_left(self, job_folder: Path, stopped_worker_id: str) -> SpooledJob | None:
        """The job a stopped worker left in `job_folder`, if the folder is what a worker writes: named by a job id,
        a real folder of this user's, its job.json naming that id and an attempt of that worker, every file in it
        a regular file (the images job.json names, and job.json). Else None, the folder logged and removed."""
        try:
            job = self._read_left(job_folder, stopped_worker_id)
        except (OSError, ValueError, TypeError) as e:  # cut short before job.json, torn, or not a worker's
            log.warning("spool: removing %s, not a job a stopped worker left: %s", job_folder, e)
            remove_folder(job_folder)
            return None
        return job

    def _read_left(self, job_folder: Path, stopped_worker_id: str) -> SpooledJob:
        if not is_job_id(job_folder.name):
            raise ValueError("its name is not a job id")
        why = unsafe_because(job_folder)
        if why is not None:
            raise ValueError(f"it {why}")
        folder_fd = open_folder(job_folder)
        try:
            job = SpooledJob.from_json(read_regular(folder_fd, JOB_FILE, MAX_DESCRIPTION_BYTES).decode())
            if job.job_id != job_folder.name:
                raise ValueError(f"its {JOB_FILE} names job {job.job_id!r}")
            if worker_of(job.holder) != stopped_worker_id:
                raise ValueError(f"its {JOB_FILE} names attempt {job.holder!r}, not one of worker {stopped_worker_id}")
            names = [file_name(key) for key in job.image_keys]
            if not job.image_keys or not all(IMAGE_FILE_PATTERN.fullmatch(name) for name in names):
                raise ValueError(f"its {JOB_FILE} names images that are not its own")
            if set(os.listdir(folder_fd)) - {JOB_FILE, *names}:
                raise ValueError(f"it holds files its {JOB_FILE} does not name")
            job.num_bytes = sum(len(read_regular(folder_fd, name)) for name in names)  # each a regular file
        finally:
            os.close(folder_fd)
        job.in_memory = None
        return job

    def move_here(self, orphan: Orphan) -> None:
        """Into this worker's folder (raises OSError)."""
        os.replace(orphan.folder, self._job_folder(orphan.job.job_id))

    def discard(self, orphan: Orphan) -> None:
        remove_folder(orphan.folder)

    def close(self) -> None:
        """Release the lock: what is left here is adopted by the next worker that looks."""
        os.close(self._lock)


class _lock_of_stopped_worker:
    """Context manager: True (holding its lock) if the worker whose spool folder this is has stopped."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.descriptor: int | None = None

    def __enter__(self) -> bool:
        try:
            self.descriptor = descriptor = open_lock(self.folder, LOCK_FILE)
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: that worker lives (or the folder went meanwhile, or its lock is a link)
            return False
        return True

    def __exit__(self, *exc_info: object) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)


def file_name(key: str) -> str:
    """An image's file in its job's spool folder: the key's last part, `{index}.{format}`, unique within the job."""
    return key.rsplit("/", 1)[-1]


def default_spool_dir() -> Path:
    """This user's: `$XDG_STATE_HOME/stepwise/spool`, else `~/.local/state/stepwise/spool` (never a folder every
    user can write, such as the system's temporary folder)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "stepwise" / "spool"


def open_spool(spool_dir: str | None, worker_id: str) -> ImageSpool:
    root = Path(spool_dir).expanduser().resolve() if spool_dir else default_spool_dir()
    return ImageSpool(root, worker_id)
