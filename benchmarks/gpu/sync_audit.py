"""Device syncs while a block runs, by thread and call site (CUDA's sync debug mode).

`torch.cuda.set_sync_debug_mode("warn")` warns at every operation that waits for the device (a `.item()`, a
`nonzero`, a copy from pageable memory, `torch.equal`...). Each warning is counted under the thread that
raised it and the first frame outside torch; nothing is printed. Off the GPU it counts nothing.
"""

from __future__ import annotations

import threading
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def counting_syncs(counts: Counter, device: torch.device) -> Iterator[None]:
    """Count the block's device syncs into `counts` (key: "thread at file:line function")."""
    if device.type != "cuda":
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def count(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001  (warnings' hook)
            if "synchroniz" not in str(message):
                return shown(message, category, filename, lineno, file, line)
            frame = next((f for f in reversed(traceback.extract_stack()[:-1]) if "/torch/" not in f.filename), None)
            site = f"{'/'.join(frame.filename.rsplit('/', 2)[-2:])}:{frame.lineno} {frame.name}" if frame else "?"
            counts[f"{threading.current_thread().name} at {site}"] += 1

        warnings.showwarning = count
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
