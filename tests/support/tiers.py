"""The test tiers: markers that say what a test starts (registered in pyproject.toml, described in
docs/testing.md), so that `pytest -m "not e2e"` and the like leave the slow kinds out.

The helpers that start such a thing call `require`: a test that starts one without its marker fails at once,
naming the marker, so the tiers stay true as tests are added. The conftest tells this module which test runs.
"""

from __future__ import annotations

import pytest

E2E = "e2e"  # starts the service's own processes: `stepwise api`, a worker, `stepwise up`
WORKERS = "workers"  # starts worker processes (each loads its model: about 2 s here as a fork); an e2e test too
BROWSER = "browser"  # drives headless Chromium; an e2e test too
DEPLOY = "deploy"  # checks what deploys the service: compose, Kubernetes, Dockerfiles, the installed wheel

IMPLIED = {WORKERS: E2E, BROWSER: E2E}

_running: pytest.Item | None = None


def set_running(item: pytest.Item) -> None:
    global _running
    _running = item


def add_implied(item: pytest.Item) -> None:
    """Mark a worker or browser test e2e as well, so `-m "not e2e"` leaves it out."""
    for marker, implied in IMPLIED.items():
        if item.get_closest_marker(marker) is not None and item.get_closest_marker(implied) is None:
            item.add_marker(implied)


def require(marker: str, what: str) -> None:
    """Fail the running test unless it carries `marker`: it is about to start `what`."""
    if _running is not None and _running.get_closest_marker(marker) is None:
        pytest.fail(f"{_running.nodeid} starts {what}: mark it @pytest.mark.{marker} (docs/testing.md)", pytrace=False)
