"""The job store over Redis Sentinel (storage.redis_clients) and the replica wait (storage.replica_wait), on real
redis-server processes: a master, a replica and sentinels on free loopback ports.

The end-to-end failover with an API and a worker is tests/faults/test_sentinel_failover.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time

import pytest
import redis
from celery import Celery

from storage.api_keys import ApiKeyStore
from storage.errors import RedisUnavailableError
from storage.job_event_feed import JobEventFeed
from storage.job_record import JobState
from storage.job_store import JobStore
from storage.queue_names import generate_queue
from storage.redis_clients import celery_redis_config, close_redis, open_redis
from storage.redis_location import with_sentinel_master
from storage.replica_wait import ReplicaUnconfirmedError
from tests.support.sentinel import MASTER_ARGUMENTS, MASTER_NAME, SentinelCluster, start_replica
from tests.support.servers import RedisServer, TlsFiles

pytestmark = pytest.mark.timeout(120)

PARAMS = {"prompt": "a fox", "model": "builtin:tiny"}
QUEUE = generate_queue("builtin:tiny")


class AsyncWatcher:
    """A watch of a JobEventFeed (what `stepwise api`'s event streams use), on an event loop of its own
    thread, driven from the test."""

    def __init__(self, url: str, store: JobStore, job_id: str) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.watching = contextlib.ExitStack()

        async def start():
            self.feed = JobEventFeed(url, store.keys)
            return self.watching.enter_context(self.feed.watch(job_id))

        self.watch = self._run(start())

    def _run(self, coroutine, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def wait(self, timeout: float) -> bool:
        return self._run(self.watch.wait(timeout), timeout + 5)

    def close(self) -> None:
        async def stop():
            self.watching.close()
            await self.feed.close()

        self._run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_a_store_follows_a_failover_keeping_what_a_replica_confirmed_and_loading_its_scripts_again(tmp_path):
    cluster = SentinelCluster(tmp_path).start()
    url = with_sentinel_master(cluster.url, MASTER_NAME)
    store = JobStore(url, job_ttl_seconds=600)
    try:
        created = [store.create(tenant="t", params=PARAMS)[0].job_id for _ in range(20)]
        running = store.take_next(QUEUE, "w1", 60)
        assert running is not None
        old_port = cluster.master.port
        async_watch = AsyncWatcher(url, store, running.job_id)
        time.sleep(0.5)  # the feed's subscription is on the master now
        cluster.kill_master()  # with no time for anything unconfirmed to reach the replica
        new_master = cluster.wait_for_failover(old_port)

        # Everything acknowledged survived; scripts (not replicated in Redis 7) are loaded again on use.
        assert all(store.get(job_id) is not None for job_id in created)
        assert store.renew_lease(running.job_id, running.holder, 60)
        assert async_watch.wait(10), "no wake-up after the failover"  # the feed, resubscribed, wakes its waiters
        store.set_progress(running.job_id, 1, 4)
        assert async_watch.wait(10), "the new master's news did not arrive"  # and then hears the new master's news
        async_watch.close()
        assert store.create(tenant="t", params=PARAMS)[1]  # no replica left: nothing to wait for
        assert store.take_next(QUEUE, "w1", 60) is not None
        assert store.finish(running.job_id, JobState.SUCCEEDED, holder=running.holder)
        with cluster.client(new_master) as client:
            assert client.hget(store.job_key(running.job_id), "state") == b"succeeded"  # the store's writes went there
    finally:
        store.close()
        cluster.stop()


def test_a_create_cancel_delete_or_key_revocation_no_replica_confirms_is_not_acknowledged(tmp_path):
    master = RedisServer(tmp_path / "master", appendonly=False, extra_arguments=MASTER_ARGUMENTS).start()
    replica = start_replica(tmp_path / "replica", master)
    # A generous wait where the replica confirms (a loaded machine can starve its acknowledgement past a short
    # one), a short one where it cannot.
    patient = JobStore(master.url, replica_wait_seconds=10)
    store = JobStore(master.url, replica_wait_seconds=0.3)
    keys = ApiKeyStore(store.redis, store.keys, store.replica_wait)
    try:
        job = patient.create(tenant="t", params=PARAMS)[0]  # the replica confirms: acknowledged
        key, record = ApiKeyStore(patient.redis, patient.keys, patient.replica_wait).create("t")
        assert store.replica_wait.online_replicas() == 1

        os.kill(replica.process.pid, signal.SIGSTOP)  # still connected, confirming nothing
        try:
            for write in (
                lambda: store.create(tenant="t", params=PARAMS),
                lambda: store.request_cancel(job.job_id),
                lambda: store.delete(job.job_id, 60),
                lambda: keys.revoke(record.key_id),
            ):
                started = time.monotonic()
                with pytest.raises(ReplicaUnconfirmedError, match="STEPWISE_REDIS_REPLICA_WAIT"):
                    write()
                assert 0.25 < time.monotonic() - started < 10  # waited for the replica, and gave up (bounded)
            assert issubclass(ReplicaUnconfirmedError, RedisUnavailableError)  # what the API answers 503 for

            without_wait = JobStore(master.url, replica_wait_seconds=0)
            assert without_wait.create(tenant="t", params=PARAMS)[1]
            without_wait.close()
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        assert patient.create(tenant="t", params=PARAMS)[1]
    finally:
        patient.close()
        store.close()
        replica.stop()
        master.stop()


def test_sentinels_over_tls_carry_the_job_store_the_event_feed_and_celerys_broker(tmp_path):
    cluster = SentinelCluster(tmp_path / "redis", num_replicas=0, num_sentinels=1, tls=TlsFiles(tmp_path / "tls"))
    cluster.start()
    url = with_sentinel_master(cluster.url, MASTER_NAME)
    store = JobStore(url)
    app = Celery("stepwise-test", set_as_current=False)
    app.conf.update(celery_redis_config(url, broker_transport_options={}))
    try:
        job = store.create(tenant="t", params=PARAMS)[0]
        assert store.take_next(QUEUE, "w1", 60).job_id == job.job_id

        async def read_state() -> str | None:
            feed = JobEventFeed(url, store.keys)
            try:
                return await feed.state_of(job.job_id)
            finally:
                await feed.close()

        assert asyncio.run(read_state()) == "running"
        with app.connection_for_write() as connection:
            queue = connection.SimpleQueue("stepwise-tls-test")
            queue.put({"job_id": job.job_id})
            assert queue.get(timeout=10).payload == {"job_id": job.job_id}
            queue.close()
        port = cluster.sentinel_ports[0]
        without_certificate = f"sentinels://127.0.0.1:{port}/0?master_name={MASTER_NAME}&ssl_ca_certs={cluster.tls.ca}"
        client = open_redis(without_certificate, socket_timeout=2)
        with pytest.raises(redis.ConnectionError):  # the TLS options are what made the connections above
            client.ping()
        close_redis(client)
    finally:
        app.close()
        store.close()
        cluster.stop()
