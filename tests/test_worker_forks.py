"""The tests' worker fork server (tests/support/worker_forks.py) forks only what would run the same as a started
process: the worker's own command, with an environment that differs only in what no library reads when
imported. Anything else is started as before, so a test never runs a worker the operator's command would not."""

from __future__ import annotations

import sys

from tests.support.worker_forks import is_same_process

WORKER = [sys.executable, "-m", "celery", "-A", "worker", "worker", "-Q", "stepwise.generate"]
SERVER_ENV = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1", "HOME": "/root"}


def test_a_worker_whose_settings_credentials_and_test_name_differ_is_forked():
    env = {
        **SERVER_ENV,
        "STEPWISE_MODEL": "builtin:tiny",
        "AWS_ACCESS_KEY_ID": "testing",
        "PYTEST_CURRENT_TEST": "tests/x.py::test_y (call)",
    }

    assert is_same_process(WORKER, env, SERVER_ENV)


def test_anything_a_library_may_read_when_imported_or_another_command_is_started_as_before():
    assert not is_same_process(WORKER, {**SERVER_ENV, "OMP_NUM_THREADS": "4"}, SERVER_ENV)  # torch's threads
    assert not is_same_process(WORKER, {**SERVER_ENV, "HF_HOME": "/elsewhere"}, SERVER_ENV)
    assert not is_same_process(WORKER, {"PATH": "/usr/bin", "HOME": "/root"}, SERVER_ENV)  # one fewer
    assert not is_same_process(["/opt/other/python", *WORKER[1:]], SERVER_ENV, SERVER_ENV)
    assert not is_same_process([sys.executable, "-m", "stepwise_cli.main", "worker"], SERVER_ENV, SERVER_ENV)
