"""Which Redis a process uses, found the same way by every stepwise process and by `celery -A worker ...`:

1. `STEPWISE_REDIS_URL`, when it is set (a `sentinel://` URL with STEPWISE_REDIS_SENTINEL_MASTER's name folded
   in: `with_sentinel_master`; storage.redis_clients connects by it);
2. else the Redis of a `stepwise up` still running from this folder: `up` saves its Redis URL and its
   process id in `<STEPWISE_VAR_DIR>/stepwise.json` (the state file, which also holds the API's URL and
   key for `stepwise submit`), and the URL counts while that process lives;
3. else, when there is no state file, the default, `redis://127.0.0.1:6379/0`.

So a shell in the folder where `make run` runs reaches that Redis with `celery -A worker inspect ...`,
`stepwise keys` or a second `stepwise worker`, without exporting anything, and never a stale one. A state file
whose `up` no longer runs (or that cannot be read) stops the process with a SettingsError naming the file, the
Redis and the pid it holds: falling back to the default there would quietly reach whatever else listens on
6379 (another program's Redis) instead of this folder's service.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from settings import SettingsError, declared, default
from settings.sentinel_url import SentinelUrl, is_sentinel_url

STATE_FILE_NAME = "stepwise.json"


@dataclass(frozen=True)
class RedisLocation:
    url: str  # checked and spelled as STEPWISE_REDIS_URL's kind gives it (settings.declaration.RedisUrl)
    source: str  # where it came from, in words: "STEPWISE_REDIS_URL", "... (stepwise up, pid N)", "the default"

    def describe(self) -> str:
        """The URL without its password, and where it came from: safe for a log line."""
        return f"{mask_password(self.url)} ({self.source})"


def find_redis(configured: str | None, var_dir: Path, sentinel_master: str | None = None) -> RedisLocation:
    """`configured`: STEPWISE_REDIS_URL's checked value when it is set; `var_dir`: STEPWISE_VAR_DIR's;
    `sentinel_master`: STEPWISE_REDIS_SENTINEL_MASTER's, which a `sentinel://` URL needs (folded into it)."""
    if configured:
        return RedisLocation(with_sentinel_master(configured, sentinel_master), "STEPWISE_REDIS_URL")
    state_file = (var_dir / STATE_FILE_NAME).absolute()
    if not state_file.exists():
        return RedisLocation(default("STEPWISE_REDIS_URL"), "the default")
    saved = running_up_redis(state_file)
    if saved is None:
        raise SettingsError(stopped_up_message(state_file))
    return saved


def with_sentinel_master(url: str, master: str | None) -> str:
    """A `sentinel://` URL with the master's name in it (`master_name` in its query), so that the one string
    carries all a client needs, through `stepwise up`'s state file and `--redis-url` too. The name comes from
    STEPWISE_REDIS_SENTINEL_MASTER or the URL itself; both may give it if they agree."""
    if not is_sentinel_url(url):
        if master:
            raise SettingsError(
                f"STEPWISE_REDIS_SENTINEL_MASTER is set ({master!r}), but the Redis URL is not a sentinel:// URL "
                f"({mask_password(url)}): unset it, or give the sentinels"
            )
        return url
    sentinel = SentinelUrl.parse("STEPWISE_REDIS_URL", url)
    if master and sentinel.master_name and master != sentinel.master_name:
        raise SettingsError(
            f"STEPWISE_REDIS_SENTINEL_MASTER ({master!r}) and the URL's master_name ({sentinel.master_name!r}) differ"
        )
    if not (master or sentinel.master_name):
        raise SettingsError(
            "STEPWISE_REDIS_URL is a Sentinel URL: STEPWISE_REDIS_SENTINEL_MASTER must name the master "
            "(the name in the sentinels' `sentinel monitor NAME host port quorum`)"
        )
    return replace(sentinel, master_name=master or sentinel.master_name).to_text()


def running_up_redis(state_file: Path) -> RedisLocation | None:
    """The Redis URL a `stepwise up` saved in `state_file`, if that `up` is still running."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        saved = json.loads(state_file.read_text())
        url, pid = str(saved["redis_url"]), int(saved["pid"])
        if is_running(pid):
            checked = declared("STEPWISE_REDIS_URL").kind.parse(f"redis_url in {state_file}", url)
            return RedisLocation(checked, f"{state_file}, saved by `stepwise up`, pid {pid}")
    return None


def stopped_up_message(state_file: Path) -> str:
    """Why the state file's Redis is not used: what it names and that its `up` is not running, and what to do."""
    try:
        saved = json.loads(state_file.read_text())
        tried = f"Redis {mask_password(str(saved['redis_url']))} of the `stepwise up` with pid {saved.get('pid')}"
    except (OSError, ValueError, TypeError, KeyError) as e:
        tried = f"a Redis it cannot tell ({type(e).__name__}: {e})"
    return (
        f"STEPWISE_REDIS_URL is not set, and {state_file} names {tried}, which is not running: start it again "
        "(`stepwise up` or `make run` in this folder), or set STEPWISE_REDIS_URL to the Redis you mean "
        "(the default is not tried: another program may answer there)"
    )


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
    """`redis://:secret@host:6379/0` -> `redis://:***@host:6379/0`; a URL without a password is unchanged. A
    Sentinel URL's passwords (the master's, the sentinels' `sentinel_password`) are masked alike."""
    if is_sentinel_url(url):
        sentinel = SentinelUrl.parse("a Redis URL", url)
        masked = replace(
            sentinel,
            password="***" if sentinel.password else "",
            sentinel_password="***" if sentinel.sentinel_password else "",
        )
        return masked.to_text().replace("%2A%2A%2A", "***")
    parts = urlsplit(url)
    if not parts.password:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
