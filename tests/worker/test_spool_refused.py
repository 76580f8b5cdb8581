"""A worker does not start on a spool folder another user could have planted files in (issue 48, E1): one owned
by another user, or one every user can write. It exits non-zero before it loads its model, naming the folder and
why. The tests run as root, so "another user" is uid 65534, made real with chown."""

from __future__ import annotations

import os

import pytest

from tests.support.cluster import Cluster
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.workers]


def refused_start(cluster: Cluster, spool) -> str:
    """Start a worker on `spool`; it must exit non-zero. Returns its log."""
    worker = cluster.start_worker("refused", wait=False, STEPWISE_SPOOL_DIR=str(spool))
    code = wait_for(lambda: worker.process.poll() is not None, 180, "the worker to exit") and worker.process.returncode
    log = worker.log_text()
    assert code not in (0, None), log
    assert "loading model" not in log  # refused before anything else
    return log


def test_a_worker_refuses_a_spool_folder_another_user_owns(folder_cluster, tmp_path):
    spool = tmp_path / "theirs"
    spool.mkdir(mode=0o700)
    os.chown(spool, 65534, 65534)

    log = refused_start(folder_cluster, spool)

    assert f"spool folder {spool} belongs to uid 65534, not to this worker's user (uid {os.geteuid()})" in log
    assert list(spool.iterdir()) == []  # nothing made in it


def test_a_worker_refuses_a_spool_folder_every_user_can_write(folder_cluster, tmp_path):
    spool = tmp_path / "open-to-all"
    spool.mkdir()
    spool.chmod(0o777)

    log = refused_start(folder_cluster, spool)

    assert f"spool folder {spool} can be written by other users (mode 0777)" in log
    assert list(spool.iterdir()) == []
