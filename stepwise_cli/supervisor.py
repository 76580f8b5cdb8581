"""The supervisor of `stepwise up`: starts children, relays their output, says why one died.

Each child runs in its own process group (so a stop reaches gunicorn's workers) and is told
to die with `up` if `up` is killed outright. Their output comes out prefixed with the child's
name, with every URL's password masked.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit


class ServiceError(Exception):
    """A child could not start, did not become ready in time, or died."""


class StopRequested(Exception):
    """Ctrl-C or SIGTERM arrived."""


# Lines a child prints that a user cannot act on, replaced by a short explanation (once).
EXPLAINED_LINES = {
    "Memory overcommit must be enabled": "Redis warns that vm.overcommit_memory is 0; harmless for the small "
    "data set of `stepwise up` (see docs/operations.md)",
}


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    stop_timeout: float  # seconds between SIGTERM and SIGKILL
    last_lines: collections.deque = field(default_factory=lambda: collections.deque(maxlen=5))  # of its output
    reader: threading.Thread | None = None  # relays its output


def describe_exit(child: Child) -> str:
    """What happened to a child that exited on its own, in one sentence a user can act on."""
    code = child.process.returncode
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        cause = " (out of memory, or killed by someone)" if -code == signal.SIGKILL else ""
        what = f"{child.name} was killed by {name}{cause}"
    elif code == 0:
        what = f"{child.name} exited with status 0 although nothing asked it to stop"
    else:
        what = f"{child.name} exited with status {code}"
    last = next((line for line in reversed(child.last_lines) if line.strip()), None)
    return f"{what}; its last line: {last}" if last else f"{what}, printing nothing"


class Supervisor:
    """Starts children, prefixes their output, notices deaths, stops them in reverse order."""

    def __init__(self) -> None:
        self.children: list[Child] = []
        self.stop_requested = threading.Event()
        self.kill_requested = threading.Event()
        self._output_lock = threading.Lock()

    def on_signal(self, signum: int, frame: object) -> None:
        if self.stop_requested.is_set():
            self.kill_requested.set()
        self.stop_requested.set()

    def start(self, name: str, argv: list[str], env: dict[str, str], stop_timeout: float = 15.0) -> Child:
        process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        child = Child(name, process, stop_timeout)
        child.reader = threading.Thread(target=self._relay, args=(child,), name=f"log-{name}", daemon=True)
        child.reader.start()
        self.children.append(child)
        self.say(f"started {name} (pid {process.pid})")
        return child

    def say(self, message: str) -> None:
        self._write(f"[up] {message}\n")

    def exited_child(self) -> Child | None:
        return next((child for child in self.children if child.process.poll() is not None), None)

    def sleep(self, seconds: float) -> None:
        """Sleep, unless a stop was requested or a child died meanwhile."""
        if self.stop_requested.wait(seconds):
            raise StopRequested
        child = self.exited_child()
        if child is not None:
            child.reader.join(timeout=1)  # its last words
            raise ServiceError(describe_exit(child))

    def stop_all(self) -> None:
        for child in reversed(self.children):
            self._stop(child)
        self.children.clear()

    def _stop(self, child: Child) -> None:
        if child.process.poll() is None:
            self.say(f"stopping {child.name}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.process.pid, signal.SIGTERM)  # the leader shuts its own workers down gracefully
            deadline = time.monotonic() + child.stop_timeout
            while child.process.poll() is None and time.monotonic() < deadline and not self.kill_requested.is_set():
                time.sleep(0.1)
            if child.process.poll() is None:
                self.say(f"{child.name} did not stop in time: killing it")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signal.SIGKILL)  # whatever is left of its process group
        child.process.wait()
        child.reader.join(timeout=2)

    def _relay(self, child: Child) -> None:
        stream = child.process.stdout
        explained: set[str] = set()
        for raw in iter(stream.readline, b""):
            text = mask_urls(raw.decode("utf-8", "replace").rstrip())
            if "\r" in text:  # a progress bar redrawn in place: keep its last state
                text = next((part for part in reversed(text.split("\r")) if part.strip()), "")
            marker = next((m for m in EXPLAINED_LINES if m in text), None)
            if marker is not None:
                if marker in explained:
                    continue
                explained.add(marker)
                text = EXPLAINED_LINES[marker]
            child.last_lines.append(text)
            self._write(f"[{child.name}] {text}\n")
        stream.close()

    def _write(self, text: str) -> None:
        with self._output_lock:
            sys.stdout.write(text)
            sys.stdout.flush()


_PR_SET_PDEATHSIG = 1
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if `stepwise up` itself is killed (Linux only)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def mask_password(url: str) -> str:
    """`redis://:secret@host:6379/0` -> `redis://:***@host:6379/0`; a URL without a password is unchanged."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def mask_urls(text: str) -> str:
    """Every URL with a password in a line of text, masked."""
    return re.sub(r"[a-z][a-z0-9+.-]*://[^\s'\"<>]+", lambda match: mask_password(match.group(0)), text)
