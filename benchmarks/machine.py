"""What the numbers were measured on: the machine, the library versions, and how busy the machine was.

The load average is part of every result: on a shared machine, other processes take CPU
time from the benchmark, and the numbers mean little without it.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from importlib import metadata


def describe_machine(device: str, num_threads: int) -> dict:
    import torch

    from batching.pipelines import resolve_device

    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "diffusers": metadata.version("diffusers"),
        "transformers": metadata.version("transformers"),
        "device": str(resolve_device(device)),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch_num_threads": num_threads,
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


class LoadSampler:
    """Samples os.getloadavg() every `interval` seconds on a daemon thread while running."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self.samples: list[tuple[float, float]] = []  # (seconds since start, 1-minute load average)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)
        self._start = time.monotonic()

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval):
                return

    def _sample(self) -> None:
        self.samples.append((round(time.monotonic() - self._start, 1), os.getloadavg()[0]))

    def summary(self) -> dict:
        values = [load for _, load in self.samples] or [os.getloadavg()[0]]
        return {
            "one_minute_min": min(values),
            "one_minute_mean": sum(values) / len(values),
            "one_minute_max": max(values),
            "samples": self.samples,
        }
