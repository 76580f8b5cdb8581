"""The engine's one setting of its own: where built-in models are built and cached (STEPWISE_CACHE_DIR).

Everything else an engine does comes from its `EngineConfig`; the worker and the command line
read their variables and pass them in.
"""

from __future__ import annotations

from pathlib import Path

from settings import read


def cache_dir() -> Path:
    configured = read("STEPWISE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "stepwise"
