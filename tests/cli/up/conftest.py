"""One `stepwise up` on free ports for every test in this folder (its worker loads its model once); the last test
(test_workers_and_signals.py, last by name) stops it with SIGTERM and checks that no process it started is left."""

from __future__ import annotations

import psutil
import pytest

from tests.support.up_process import UpProcess


@pytest.fixture(scope="package")
def up(tmp_path_factory):
    service = UpProcess(tmp_path_factory.mktemp("up"))
    leftovers: list[psutil.Process] = []
    try:
        service.start()
        leftovers = service.descendants()
        yield service
    finally:
        service.stop()
        for process in leftovers:
            if process.is_running():
                process.kill()
