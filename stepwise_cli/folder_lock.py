"""One `stepwise up` per folder: `up` holds an exclusive lock on `<var dir>/up.lock` for as long as it runs,
with its pid and API URL written in the file.

A second `up` (or `make run`) from the same folder finds the lock taken and exits at once naming the first,
before it starts a second redis-server on the same data files or rewrites `stepwise.json` (which would leave
every other command of that folder looking for a service that is not there). The kernel lets go of an
`flock` when its process ends, however it ends, so a killed `up` leaves no stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

LOCK_FILE_NAME = "up.lock"


class FolderInUse(Exception):
    """Another `stepwise up` holds this folder; the message names it (pid, API URL) and the ways out."""

    def __init__(self, lock_path: Path, pid: int | None, api_url: str | None) -> None:
        who = f"pid {pid}" if pid else "its pid not written yet"
        where = f", API {api_url}" if api_url else ""
        stop = f"Ctrl-C in its terminal, or `kill {pid}`" if pid else "Ctrl-C in its terminal"
        super().__init__(
            f"a `stepwise up` already runs from this folder ({who}{where}; {lock_path}): use it, stop it first "
            f"({stop}), or start another one with its own --var-dir and --port"
        )


def hold_folder(var_dir: Path, api_url: str) -> int:
    """Take `var_dir` for this process and write who holds it; returns the lock file's descriptor, which the
    caller keeps open until it exits (closing it lets go). Raises FolderInUse when another process holds it."""
    path = var_dir / LOCK_FILE_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = read_holder(fd)
        os.close(fd)
        raise FolderInUse(path, holder.get("pid"), holder.get("api_url")) from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "api_url": api_url}).encode() + b"\n")
    return fd


def read_holder(fd: int) -> dict:
    """What the holder wrote ({} while it has not written yet)."""
    with contextlib.suppress(OSError, ValueError):
        holder = json.loads(os.pread(fd, 4096, 0).decode())
        if isinstance(holder, dict):
            return holder
    return {}
