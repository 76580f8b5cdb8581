"""Which Redis a process uses, found the same way by every stepwise process and by `celery -A worker ...`:

1. `STEPWISE_REDIS_URL`, when it is set;
2. else the Redis of a `stepwise up` still running from this folder: `up` saves its Redis URL and its
   process id in `<STEPWISE_VAR_DIR>/stepwise.json` (the state file, which also holds the API's URL and
   key for `stepwise submit`), and the URL counts while that process lives;
3. else the default, `redis://127.0.0.1:6379/0`.

So a shell in the folder where `make run` runs reaches that Redis with `celery -A worker inspect ...`,
`stepwise keys` or a second `stepwise worker`, without exporting anything, and never a stale one.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from settings import declared, default

STATE_FILE_NAME = "stepwise.json"


@dataclass(frozen=True)
class RedisLocation:
    url: str  # checked and spelled as STEPWISE_REDIS_URL's kind gives it (settings.declaration.RedisUrl)
    source: str  # where it came from, in words: "STEPWISE_REDIS_URL", "... (stepwise up, pid N)", "the default"

    def describe(self) -> str:
        """The URL without its password, and where it came from: safe for a log line."""
        return f"{mask_password(self.url)} ({self.source})"


def find_redis(configured: str | None, var_dir: Path) -> RedisLocation:
    """`configured`: STEPWISE_REDIS_URL's checked value when it is set; `var_dir`: STEPWISE_VAR_DIR's."""
    if configured:
        return RedisLocation(configured, "STEPWISE_REDIS_URL")
    state_file = (var_dir / STATE_FILE_NAME).absolute()
    saved = running_up_redis(state_file)
    if saved is not None:
        return saved
    return RedisLocation(default("STEPWISE_REDIS_URL"), "the default")


def running_up_redis(state_file: Path) -> RedisLocation | None:
    """The Redis URL a `stepwise up` saved in `state_file`, if that `up` is still running."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        saved = json.loads(state_file.read_text())
        url, pid = str(saved["redis_url"]), int(saved["pid"])
        if is_running(pid):
            checked = declared("STEPWISE_REDIS_URL").kind.parse(f"redis_url in {state_file}", url)
            return RedisLocation(checked, f"{state_file}, saved by `stepwise up`, pid {pid}")
    return None


def is_running(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def mask_password(url: str) -> str:
    """`redis://:secret@host:6379/0` -> `redis://:***@host:6379/0`; a URL without a password is unchanged."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
