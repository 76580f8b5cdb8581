"""The supervisor of `stepwise up`: starts children, relays their output, restarts one that dies.

Each child runs in its own process group (so a stop reaches granian's worker processes) and is told
to die with `up` if `up` is killed outright. Their output comes out prefixed with the child's
name, with every URL's password masked.

`up` stops its children in reverse order with SIGTERM, each within its own stop timeout (the worker's:
its drain, `STEPWISE_DRAIN_SECONDS`, plus a margin) before SIGKILL; a second Ctrl-C or SIGTERM is passed
on, and the child still stopping gets SECOND_SIGNAL_SECONDS more.

A child that exits on its own (killed, out of memory, crashed, even with status 0) is restarted
after a backoff that doubles with each quick failure (1 s, 2 s, 4 s ... at most 30 s), as a process
manager would. A child that fails MAX_FAST_FAILURES times in a row within FAST_FAILURE_SECONDS of
starting will not get better by trying again (a bad setting, a missing file): then the supervisor
gives up with the reason, and `up` stops everything.
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

from storage.redis_location import mask_password


class ServiceError(Exception):
    """A child could not start, did not become ready in time, or died."""


class StopRequested(Exception):
    """Ctrl-C or SIGTERM arrived."""


# Lines a child prints that a user cannot act on, replaced by a short explanation (once).
EXPLAINED_LINES = {
    "Memory overcommit must be enabled": "Redis warns that vm.overcommit_memory is 0; harmless for the small "
    "data set of `stepwise up` (see docs/operations.md)",
}


FAST_FAILURE_SECONDS = 10.0  # a child that exits sooner than this after starting failed fast
MAX_FAST_FAILURES = 3  # fast failures in a row after which restarting is pointless
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
SECOND_SIGNAL_SECONDS = 10.0  # after a second Ctrl-C or SIGTERM, how long a stopping child still gets


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen
    stop_timeout: float  # seconds between SIGTERM and SIGKILL
    started_at: float  # time.monotonic() of the latest start
    last_lines: collections.deque = field(default_factory=lambda: collections.deque(maxlen=5))  # of its output
    reader: threading.Thread | None = None  # relays its output
    num_fast_failures: int = 0  # exits in a row, each within FAST_FAILURE_SECONDS of its start
    restart_at: float | None = None  # time.monotonic() of the restart planned after it exited


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
    """Starts children, prefixes their output, restarts dead ones, stops them in reverse order."""

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
        child = Child(name, argv, env, self._spawn(argv, env), stop_timeout, time.monotonic())
        self._relay_output(child)
        self.children.append(child)
        self.say(f"started {name} (pid {child.process.pid})")
        return child

    def _spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def _relay_output(self, child: Child) -> None:
        child.reader = threading.Thread(target=self._relay, args=(child,), name=f"log-{child.name}", daemon=True)
        child.reader.start()

    def say(self, message: str) -> None:
        self._write(f"[up] {message}\n")

    def sleep(self, seconds: float) -> None:
        """Sleep, restarting children that died meanwhile; raises StopRequested on Ctrl-C or SIGTERM, and
        ServiceError when a child failed fast too often to try again."""
        deadline = time.monotonic() + seconds
        while True:
            self.look_after_children()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.stop_requested.wait(min(left, 0.1)):
                raise StopRequested

    def look_after_children(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._restart(child)
            elif child.process.poll() is not None:
                self._plan_restart(child, now)

    def _plan_restart(self, child: Child, now: float) -> None:
        assert child.reader is not None
        child.reader.join(timeout=1)  # its last words
        what = describe_exit(child)
        is_fast = now - child.started_at < FAST_FAILURE_SECONDS
        child.num_fast_failures = child.num_fast_failures + 1 if is_fast else 1
        if child.num_fast_failures >= MAX_FAST_FAILURES:
            raise ServiceError(
                f"{what}; it failed {child.num_fast_failures} times in a row within {FAST_FAILURE_SECONDS:.0f}s "
                "of starting, so restarting it again would not help"
            )
        backoff = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** (child.num_fast_failures - 1))
        child.restart_at = now + backoff
        self.say(f"{what}; restarting it in {backoff:.0f}s")

    def _restart(self, child: Child) -> None:
        child.restart_at = None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signal.SIGKILL)  # what is left of its process group
        child.process = self._spawn(child.argv, child.env)
        child.started_at = time.monotonic()
        self._relay_output(child)
        self.say(f"restarted {child.name} (pid {child.process.pid})")

    def stop_all(self) -> None:
        for child in reversed(self.children):
            self._stop(child)
        self.children.clear()

    def _stop(self, child: Child) -> None:
        child.restart_at = None
        if child.process.poll() is None:
            self.say(f"stopping {child.name}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.process.pid, signal.SIGTERM)  # the leader shuts its own workers down gracefully
            deadline = time.monotonic() + child.stop_timeout
            is_forwarded = False
            while child.process.poll() is None and time.monotonic() < deadline:
                if self.kill_requested.is_set() and not is_forwarded:
                    # A second Ctrl-C or SIGTERM is the child's second one too: a worker hands back its running
                    # jobs at their next step (worker.drain). Then it gets a short while more.
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.process.pid, signal.SIGTERM)
                    is_forwarded = True
                    deadline = min(deadline, time.monotonic() + SECOND_SIGNAL_SECONDS)
                time.sleep(0.1)
            if child.process.poll() is None:
                self.say(f"{child.name} did not stop in time: killing it")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signal.SIGKILL)  # whatever is left of its process group
        child.process.wait()
        if child.reader is not None:
            child.reader.join(timeout=2)

    def _relay(self, child: Child) -> None:
        stream = child.process.stdout
        assert stream is not None  # every child starts with stdout=PIPE
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


def mask_urls(text: str) -> str:
    """Every URL with a password in a line of text, masked."""
    return re.sub(r"[a-z][a-z0-9+.-]*://[^\s'\"<>]+", lambda match: mask_password(match.group(0)), text)
