"""Timing device work without waiting for it.

On CUDA, kernels run asynchronously: reading a wall clock around a forward measures
only the launch, and synchronising the device to read a true time stalls the loop that
should already be queueing the next forward. So each timed span records a pair of CUDA
events on the current stream, and the elapsed time is read later, once the end event
has completed (`collect()` only asks, it never waits). On the CPU the work is done when
the call returns, and the wall clock is the truth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class _Span:
    start: Any  # torch.cuda.Event, or the perf_counter value on the CPU
    end: Any = None


@dataclass
class DeviceTimer:
    device: torch.device
    _open: list[_Span] = field(default_factory=list)  # ended spans whose events may not have completed yet

    def start(self) -> _Span:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return _Span(event)
        return _Span(time.perf_counter())

    def stop(self, span: _Span) -> None:
        if self.device.type == "cuda":
            span.end = torch.cuda.Event(enable_timing=True)
            span.end.record(torch.cuda.current_stream(self.device))
        else:
            span.end = time.perf_counter()
        self._open.append(span)

    def collect(self) -> list[float]:
        """Seconds of every stopped span whose work has completed, oldest first; never waits."""
        done: list[float] = []
        while self._open:
            span = self._open[0]
            if self.device.type == "cuda":
                if not span.end.query():
                    break  # spans complete in stream order: later ones are not done either
                done.append(span.start.elapsed_time(span.end) / 1000)
            else:
                done.append(span.end - span.start)
            self._open.pop(0)
        return done

    def discard(self) -> None:
        self._open.clear()
