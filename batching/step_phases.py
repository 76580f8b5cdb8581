"""Where an engine iteration's time goes, phase by phase (`EngineConfig.phase_timing`; off by default).

Each iteration is cut into phases: `schedule` (inbox, admission, the plan), `start` (new samples handed to
the encoder and the started ones collected: prompt encoding when it runs inline), `inputs` (the group's
input batch), `forward` (the denoiser call), `guidance` (each sample's rows split and combined), `sampler`
(the samplers' steps), `decode` (finished samples handed to the decoder, decoded ones collected) and
`update` (the scheduler's update, progress, futures). Per phase three clocks:

- host: wall time on the loop thread (on CUDA, mostly the time to launch the work);
- cpu: the loop thread's own CPU time (`time.thread_time`); host minus cpu is time the thread did not
  run: waiting for the device (a hidden sync), for the GIL (the encode and decode threads), or for a core;
- device (CUDA only): the span between two events recorded on the loop's stream around the phase, read
  once they completed (never waiting). A span also counts the time the device sat idle waiting for the
  host's launches inside it; the gap before an iteration's first phase is the idle time between two
  iterations.

Iterations are reported apart by kind: `steady` (every forward ran the same samples as the last one) and
`churn` (a sample joined or left a forward: its inputs were refilled; or no forward ran, only the decoding
or ending of samples that left). The summary gives milliseconds per
iteration, averaged over the iterations of each kind.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

PHASES = ("schedule", "start", "inputs", "forward", "guidance", "sampler", "decode", "update")
KINDS = ("steady", "churn")


@dataclass
class _Totals:
    num_iterations: int = 0
    wall: float = 0.0  # seconds, iteration start to end on the loop thread
    host: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    cpu: dict[str, float] = field(default_factory=dict)
    device: dict[str, float] = field(default_factory=dict)  # CUDA: phase -> seconds between its events
    num_device_iterations: int = 0  # iterations whose events completed and were read
    device_gap: float = 0.0  # CUDA: seconds between the last iteration's last event and this one's first


@dataclass
class _Iteration:
    kind: str = "steady"
    host_times: list[tuple[str, float, float]] = field(default_factory=list)  # (phase, host s, cpu s)
    events: list[tuple[str, Any, Any]] = field(default_factory=list)  # CUDA: (phase, start event, end event)


class StepPhases:
    """Times the phases of the loop thread's iterations; one instance per engine. The loop thread times;
    `summary()` and `reset()` may be called from any thread (a lock guards the totals; nothing waits for the
    device)."""

    def __init__(self, device: torch.device) -> None:
        self.is_cuda = device.type == "cuda"
        self.device = device
        self.totals = {kind: _Totals() for kind in KINDS}
        self._lock = threading.Lock()
        self._current: _Iteration | None = None
        self._started = 0.0
        self._pending: list[_Iteration] = []  # ended iterations whose device events may not have completed
        self._last_end_event: Any = None  # the previous iteration's last event (device gaps)

    def reset(self) -> None:
        """Forget what was timed so far (between a warm-up and the run to profile)."""
        with self._lock:
            self.totals = {kind: _Totals() for kind in KINDS}
            self._pending.clear()
            self._last_end_event = None

    def begin_iteration(self) -> None:
        self._current = _Iteration()
        self._started = time.perf_counter()

    def mark_churn(self) -> None:
        """A forward of this iteration ran a different set of samples than the one before, or it ran no forward
        (its samples left: only decoding, failures or aborts)."""
        if self._current is not None:
            self._current.kind = "churn"

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        iteration = self._current
        if iteration is None:  # outside an iteration (a warm-up forward, say): not counted
            yield
            return
        start_event = self._record() if self.is_cuda else None
        host, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            if self.is_cuda:
                iteration.events.append((name, start_event, self._record()))
            iteration.host_times.append((name, time.perf_counter() - host, time.thread_time() - cpu))

    def end_iteration(self, counted: bool) -> None:
        """Count the iteration under its kind when the engine's stats count it (not when nothing ran, or it
        waited for the encoder), so the phases' iterations add up to the stats' `iterations`."""
        iteration, self._current = self._current, None
        if iteration is None or not counted:
            return
        wall = time.perf_counter() - self._started
        with self._lock:
            totals = self.totals[iteration.kind]
            totals.num_iterations += 1
            totals.wall += wall
            for name, host, cpu in iteration.host_times:
                totals.host[name] = totals.host.get(name, 0.0) + host
                totals.cpu[name] = totals.cpu.get(name, 0.0) + cpu
            if self.is_cuda and iteration.events:
                self._pending.append(iteration)
            self._collect()

    def summary(self) -> dict[str, Any]:
        """Per kind of iteration: how many, and milliseconds per iteration of the wall and of each phase."""
        with self._lock:
            self._collect()
            return self._summary()

    def _summary(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for kind, totals in self.totals.items():
            count = totals.num_iterations
            if not count:
                continue
            entry: dict[str, Any] = {
                "iterations": count,
                "wall_ms": _ms(totals.wall, count),
                "host_ms": {name: _ms(totals.host.get(name, 0.0), count) for name in PHASES},
                "cpu_ms": {name: _ms(totals.cpu.get(name, 0.0), count) for name in PHASES},
            }
            if self.is_cuda:
                read = totals.num_device_iterations
                entry["device_iterations"] = read
                entry["device_ms"] = {name: _ms(totals.device.get(name, 0.0), read) for name in PHASES}
                entry["device_gap_ms"] = _ms(totals.device_gap, read)
            result[kind] = entry
        return result

    def _record(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _collect(self) -> None:
        """Read the device spans of ended iterations whose last event completed, oldest first; never waits.
        Under the lock."""
        while self._pending:
            iteration = self._pending[0]
            last = iteration.events[-1][2]
            if not last.query():
                return
            self._pending.pop(0)
            totals = self.totals[iteration.kind]
            totals.num_device_iterations += 1
            for name, start, end in iteration.events:
                totals.device[name] = totals.device.get(name, 0.0) + start.elapsed_time(end) / 1000
            first = iteration.events[0][1]
            if self._last_end_event is not None:
                totals.device_gap += max(0.0, self._last_end_event.elapsed_time(first) / 1000)
            self._last_end_event = last


def _ms(seconds: float, count: int) -> float:
    return round(1000 * seconds / count, 4) if count else 0.0


class NoPhases:
    """Phase timing switched off: every call does nothing."""

    _nothing = contextlib.nullcontext()

    def reset(self) -> None:
        pass

    def begin_iteration(self) -> None:
        pass

    def mark_churn(self) -> None:
        pass

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        return self._nothing

    def end_iteration(self, counted: bool) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        return {}


Phases = StepPhases | NoPhases
