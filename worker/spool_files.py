"""The spool's files on disk, trusting nothing the worker did not write (`worker.spool`).

A spool holds finished images that the worker uploads later, maybe from another process (a restart, a worker
on the same disk). What lies there is read back as the worker's own, so it must be what a worker wrote:

- every folder is created owner-only (0700) and every file 0600; an existing spool folder is used only if it is a
  real folder (no symlink) owned by this process's user that no other user can write (else `UnsafeSpoolError`,
  naming the folder: the worker does not start on it);
- every file is opened relative to its folder's descriptor with `O_NOFOLLOW` and must be a regular file: a
  symlink planted in a job folder is never followed (a worker running as root would read any file through one);
- nothing is ever removed through a link: a folder is removed only once `lstat` says it is a real folder.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

FOLDER_MODE = 0o700
FILE_MODE = 0o600
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
MAX_DESCRIPTION_BYTES = 1 << 20  # a job.json is a few hundred bytes; more is not one a worker wrote


class UnsafeSpoolError(Exception):
    """A spool folder another user could have written to: the worker refuses it (the message names it)."""


def unsafe_because(path: Path) -> str | None:
    """Why the folder at `path` is not safe to trust (not a real folder, another user's, writable by others), or
    None. Never follows a link."""
    try:
        info = os.lstat(path)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != os.geteuid():
        return f"belongs to uid {info.st_uid}, not to this worker's user (uid {os.geteuid()})"
    if info.st_mode & OTHERS_WRITE:
        return f"can be written by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def private_folder(path: Path, *, what: str = "spool folder") -> Path:
    """`path`, created owner-only if missing (its parents as the umask says); an existing one must be safe to
    trust (`unsafe_because`), else UnsafeSpoolError naming it."""
    try:
        path.mkdir(mode=FOLDER_MODE, parents=True)
    except FileExistsError:
        pass
    why = unsafe_because(path)
    if why is not None:
        raise UnsafeSpoolError(
            f"{what} {path} {why}: refusing to use it, as another user could plant files there. Make it this "
            f"user's and writable by no other (chmod 700), or set STEPWISE_SPOOL_DIR to a folder that does not "
            f"exist yet (the worker makes it owner-only), such as {path / 'stepwise-spool'}"
        )
    return path


def write_private(folder: Path, name: str, data: bytes) -> None:
    """Write `folder/name` as a new 0600 file (replacing a regular file of that name; never through a link)."""
    descriptor = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)


def read_regular(folder_fd: int, name: str, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file `name` in the folder open as `folder_fd`, opened without following a link.
    Raises OSError for a link, anything but a regular file, or one over `max_bytes`."""
    if name in ("", ".", "..") or "/" in name:
        raise OSError(f"{name!r} is not a file name")
    descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder_fd)  # ELOOP for a symlink
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{name} is not a regular file")
        if max_bytes is not None and info.st_size > max_bytes:
            raise OSError(f"{name} is larger than {max_bytes} bytes")
        return file.read()


def open_folder(path: Path) -> int:
    """A descriptor of the real folder at `path` (OSError for a link or anything else): open files relative to it."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def open_lock(folder: Path, name: str) -> int:
    """A descriptor of the lock file `folder/name`, created 0600 if missing, never through a link."""
    return os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)


def remove_folder(path: Path) -> None:
    """Remove the real folder at `path` and what is in it (links in it are removed, never followed). A link or
    anything but a folder at `path` itself is unlinked: nothing outside the spool is ever removed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path, ignore_errors=True)  # rmtree never follows a link inside the tree
    else:
        path.unlink(missing_ok=True)
