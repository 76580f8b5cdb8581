"""A Sentinel failover under load: the master SIGKILLed while jobs run and more arrive.

Real redis-server processes on free loopback ports (a master, one replica, three sentinels that notice a
silent master after a second), a real `stepwise api` and a real worker (builtin:tiny), both given Celery's
Sentinel URL and STEPWISE_REDIS_SENTINEL_MASTER. A client submits a job every SUBMIT_EVERY seconds, each
with its own Idempotency-Key, from before the kill until submits pass again after it. What a user relies on:

- every job answered 202 succeeds (a create is acknowledged only once the replica has it, so the kill
  loses none), and none is counted as succeeded twice;
- a submit while no master answers gets a 503 naming Redis (or a 202), never a 500;
- once the sentinels have promoted the replica, submits are accepted again; and the command line
  (`stepwise keys`), Celery's broker (a webhook delivery) and its control (`celery inspect ping`) work on the
  new master too.

How long submits were refused is printed (`pytest -s`), for docs/guarantees.md."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from storage.job_record import JobState
from storage.job_store import JobStore
from storage.redis_location import with_sentinel_master
from tests.support.calls import submit
from tests.support.processes import ROOT, ApiProcess, WorkerProcess
from tests.support.sentinel import MASTER_NAME, SentinelCluster
from tests.support.servers import child_env
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.timeout(300), pytest.mark.workers]

TINY = {"prompt": "a lighthouse at dusk", "height": 64, "width": 64, "guidance_scale": 1.0, "num_inference_steps": 4}
SUBMIT_EVERY = 0.1  # seconds between a client's submits
ACCEPTED_AFTER = 5  # submits in a row that must pass once the new master is named
SERVICE_ENV = {
    "STEPWISE_REDIS_SENTINEL_MASTER": MASTER_NAME,
    "STEPWISE_JOB_LEASE_SECONDS": "60",  # longer than the failover: a running job keeps its first attempt
    "STEPWISE_PROGRESS_INTERVAL": "0.1",
}


@dataclass(frozen=True)
class Submit:
    at: float  # time.monotonic() when it was answered
    status: int
    job_id: str | None
    body: str


class Client:
    """Submits a job every SUBMIT_EVERY seconds on a thread of its own until stopped."""

    def __init__(self, api: ApiProcess) -> None:
        self.api = api
        self.submits: list[Submit] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with requests.Session() as http:
            while not self.stopped.is_set():
                body = {**TINY, "seed": len(self.submits)}
                try:
                    response = submit(http, self.api, body, **{"Idempotency-Key": uuid.uuid4().hex})
                except requests.RequestException as e:  # no answer at all: status 0, failing the test
                    self.submits.append(Submit(time.monotonic(), 0, None, repr(e)))
                    continue
                job_id = response.json().get("job_id") if response.status_code == 202 else None
                self.submits.append(Submit(time.monotonic(), response.status_code, job_id, response.text))
                self.stopped.wait(SUBMIT_EVERY)

    def accepted(self) -> list[str]:
        return [s.job_id for s in self.submits if s.job_id]

    def passing_since(self, since: float) -> int:
        """Submits answered 202 in a row at the end, all answered after `since`."""
        count = 0
        for answered in reversed(self.submits):
            if answered.at < since or answered.status != 202:
                break
            count += 1
        return count


def test_a_sentinel_failover_under_load_keeps_every_accepted_job_and_refuses_only_with_503s(tmp_path):
    cluster = SentinelCluster(tmp_path / "redis").start()
    storage_url = (tmp_path / "images").as_uri()
    api = ApiProcess(tmp_path / "api", cluster.url, storage_url, workers=1, **SERVICE_ENV)
    worker = WorkerProcess(tmp_path, cluster.url, storage_url, **SERVICE_ENV)
    store = JobStore(with_sentinel_master(cluster.url, MASTER_NAME))
    client = Client(api)
    try:
        api.launch(), worker.launch()
        api.wait_ready(), worker.wait_ready()
        client.thread.start()
        wait_for(lambda: store.counts_by_state()["succeeded"] >= 3 and store.counts_by_state()["running"], 60,
                 "jobs running and ended before the kill")  # fmt: skip

        old_port = cluster.master.port
        cluster.kill_master()
        killed_at = time.monotonic()
        cluster.wait_for_failover(old_port)
        promoted_at = time.monotonic()
        wait_for(lambda: client.passing_since(promoted_at) >= ACCEPTED_AFTER, 60, "submits to pass again")
        client.stopped.set()
        client.thread.join(10)

        # The other ways in, on the new master: the command line writes a key, the API reads it, the worker's
        # webhook goes through Celery's broker (its consumer reconnects on Celery's own backoff: 2 s, 4 s, ...),
        # and Celery's control reaches the worker.
        created, _ = command(["stepwise", "keys", "create", "--tenant", "dana"], cluster).communicate(timeout=60)
        dana = {"Authorization": f"Bearer {created.strip()}"}
        with WebhookReceiver() as receiver, requests.Session() as http:
            body = {**TINY, "webhook_url": receiver.url("/after-failover")}
            late = wait_for(lambda: accepted(http.post(f"{api.url}/v1/jobs", json=body, headers=dana, timeout=10)),
                            10, "the API to know the key created after the failover")  # fmt: skip
            deliveries = receiver.wait_for("/after-failover", lambda got: len(got) >= 2, timeout=60)
        ping, ping_errors = command(["celery", "-A", "worker", "inspect", "ping", "-t", "10"], cluster).communicate(
            timeout=60
        )

        accepted_ids = client.accepted()
        records = {
            job_id: wait_for(lambda j=job_id: ended(store, j), 120, f"job {job_id} to end") for job_id in accepted_ids
        }
        listed = store.list_for_tenant("alice", limit=1000)[0]
        totals = store.counts_by_state()
        worker.assert_running()
        api.assert_running()
    finally:
        client.stopped.set()
        store.close()
        worker.stop()
        api.stop()
        cluster.stop()

    refused = [s for s in client.submits if s.status != 202]
    assert {s.status for s in refused} <= {503}, [(s.status, s.body) for s in refused]
    assert refused, "no submit met the failover: the test did not test it"
    assert all("Redis" in s.body and '"code":"unavailable"' in s.body for s in refused), refused[0].body
    window = refused[-1].at - refused[0].at
    print(
        f"\nsentinel failover: {len(accepted_ids)} jobs accepted, {len(refused)} submits refused with 503 over "
        f"{window:.1f}s (first {refused[0].at - killed_at:.1f}s after the kill, last {refused[-1].at - killed_at:.1f}s "
        f"after it; the sentinels named the new master {promoted_at - killed_at:.1f}s after it); attempts "
        f"{sorted({r.attempts for r in records.values()})}"
    )
    assert {job_id: r.state for job_id, r in records.items()} == dict.fromkeys(accepted_ids, JobState.SUCCEEDED)
    assert f"{worker.name}: OK" in ping, ping + ping_errors
    assert sorted(d.payload["type"] for d in deliveries) == ["job.completed", "job.started"], late.text
    # Nothing counted twice: every job of the client's tenant (those answered 503 whose create still landed
    # included) succeeded once, and the total of successes is their number and dana's one.
    assert all(record.state == JobState.SUCCEEDED for record in listed)
    assert totals["succeeded"] == len(listed) + 1 and len(listed) >= len(accepted_ids)


def accepted(response: requests.Response) -> requests.Response | None:
    return response if response.status_code == 202 else None


def command(argv: list[str], cluster: SentinelCluster) -> subprocess.Popen:
    """One of the project's command-line tools, given the sentinels as every process is."""
    executable = str(Path(sys.executable).with_name(argv[0]))
    env = child_env(**cluster.env)
    return subprocess.Popen(
        [executable, *argv[1:]], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )


def ended(store: JobStore, job_id: str):
    record = store.get(job_id)
    return record if record is not None and record.state.is_terminal else None
