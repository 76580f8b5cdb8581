"""Redis Sentinel for tests: real redis-server processes on free loopback ports, a master, its replicas and
sentinels (`redis-server CONF --sentinel`), with the failure detection tuned down so a failover takes seconds.

With `tls`, every server and sentinel speaks only TLS and asks each client for a certificate (as
`RedisServer(tls=...)`); the replicas and the sentinels reach the master over TLS too."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import redis

from tests.support.servers import RedisServer, TlsFiles, free_port, stop_process, wait_for_port
from tests.support.waiting import wait_for

MASTER_NAME = "stepwise-master"
# A replica's first sync starts at once (redis-server waits 5 s by default, for more replicas to share it).
MASTER_ARGUMENTS = ("--repl-diskless-sync-delay", "0")


def online_replicas(master: RedisServer) -> int:
    """The replicas in sync with `master` (INFO replication: state online)."""
    with redis.Redis.from_url(master.url, socket_timeout=2) as client:
        info = client.info("replication")
    return sum(1 for key, value in info.items() if key.startswith("slave") and value.get("state") == "online")


def start_replica(folder: Path, master: RedisServer) -> RedisServer:
    """A replica of `master`, in sync when this returns."""
    replica_of = ("--replicaof", "127.0.0.1", str(master.port))
    replica = RedisServer(folder, appendonly=False, extra_arguments=replica_of).start()
    wait_for(lambda: online_replicas(master) >= 1, 20, "the replica to sync with the master")
    return replica


class SentinelCluster:
    def __init__(
        self,
        folder: Path,
        *,
        num_replicas: int = 1,
        num_sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        tls: TlsFiles | None = None,
    ) -> None:
        self.folder = folder
        self.num_replicas = num_replicas
        self.num_sentinels = num_sentinels
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.tls = tls
        self.quorum = num_sentinels // 2 + 1
        self.master: RedisServer | None = None
        self.replicas: list[RedisServer] = []
        self.sentinel_ports = [free_port() for _ in range(num_sentinels)]
        self.sentinel_processes: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        """STEPWISE_REDIS_URL, in Celery's form (the master's name goes in STEPWISE_REDIS_SENTINEL_MASTER)."""
        scheme = "sentinels" if self.tls else "sentinel"
        url = ";".join(f"{scheme}://127.0.0.1:{port}" for port in self.sentinel_ports) + "/0"
        return url + (f"?{self.tls.client_query()}" if self.tls else "")

    @property
    def env(self) -> dict[str, str]:
        return {"STEPWISE_REDIS_URL": self.url, "STEPWISE_REDIS_SENTINEL_MASTER": MASTER_NAME}

    def _tls_arguments(self) -> tuple[str, ...]:
        return ("--tls-replication", "yes") if self.tls else ()

    def start(self) -> SentinelCluster:
        self.master = RedisServer(
            self.folder / "master", appendonly=False, tls=self.tls, extra_arguments=MASTER_ARGUMENTS
        ).start()
        for index in range(self.num_replicas):
            replica_of = ("--replicaof", "127.0.0.1", str(self.master.port), *self._tls_arguments())
            self.replicas.append(
                RedisServer(self.folder / f"replica{index}", appendonly=False, tls=self.tls, extra_arguments=replica_of)
            )
            self.replicas[-1].start()
        wait_for(lambda: self._online_replicas() == self.num_replicas, 20, "the replicas to sync with the master")
        for index, port in enumerate(self.sentinel_ports):
            self.sentinel_processes.append(self._start_sentinel(index, port))
        for port in self.sentinel_ports:
            wait_for_port(port)
        wait_for(self._sentinels_agree, 30, "every sentinel to know the master, its replicas and the other sentinels")
        return self

    def _start_sentinel(self, index: int, port: int) -> subprocess.Popen:
        assert self.master is not None
        folder = self.folder / f"sentinel{index}"
        folder.mkdir(parents=True, exist_ok=True)
        listen = [f"port {port}"]
        if self.tls:
            listen = [
                "port 0",
                f"tls-port {port}",
                f"tls-cert-file {self.tls.server}",
                f"tls-key-file {self.tls.server_key}",
                f"tls-ca-cert-file {self.tls.ca}",
                "tls-auth-clients yes",
                "tls-replication yes",
            ]
        conf = folder / "sentinel.conf"  # sentinel rewrites it as it learns: one file each, writable
        conf.write_text(
            "\n".join(
                [
                    *listen,
                    "bind 127.0.0.1",
                    f"dir {folder}",
                    f"logfile {folder / 'sentinel.log'}",
                    f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} {self.quorum}",
                    f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
                    f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}",
                    f"sentinel parallel-syncs {MASTER_NAME} 1",
                    "",
                ]
            )
        )
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (make test installs it)"
        return subprocess.Popen([binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def client(self, server: RedisServer) -> redis.Redis:
        return redis.Redis.from_url(server.url, socket_timeout=2, socket_connect_timeout=2)

    def sentinel_client(self, port: int) -> redis.Redis:
        if self.tls is None:
            return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)
        return redis.Redis.from_url(f"rediss://127.0.0.1:{port}/0?{self.tls.client_query()}", socket_timeout=2)

    def _online_replicas(self) -> int:
        assert self.master is not None
        return online_replicas(self.master)

    def _sentinels_agree(self) -> bool:
        for port in self.sentinel_ports:
            with self.sentinel_client(port) as client:
                try:
                    state = client.sentinel_master(MASTER_NAME)
                except redis.RedisError:
                    return False
            if state["num-slaves"] != self.num_replicas or state["num-other-sentinels"] != self.num_sentinels - 1:
                return False
        return True

    def master_port(self) -> int | None:
        """The master's port as a majority of the sentinels see it now."""
        seen = []
        for port in self.sentinel_ports:
            try:
                with self.sentinel_client(port) as client:
                    seen.append(int(client.sentinel_get_master_addr_by_name(MASTER_NAME)[1]))
            except (redis.RedisError, TypeError):
                continue
        for candidate in set(seen):
            if seen.count(candidate) >= self.quorum:
                return candidate
        return None

    def kill_master(self) -> RedisServer:
        """SIGKILL the master: nothing it has not replicated yet survives. Returns the replica that should follow."""
        assert self.master is not None and self.master.process is not None
        os.kill(self.master.process.pid, signal.SIGKILL)
        self.master.process.wait()
        self.master.process = None
        return self.replicas[0]

    def wait_for_failover(self, old_port: int, timeout: float = 60.0) -> RedisServer:
        """Wait until the sentinels name a new master and it answers as one; returns it."""
        new_port = wait_for(lambda: (port := self.master_port()) and port != old_port and port, timeout, "a failover")
        server = next(replica for replica in self.replicas if replica.port == new_port)
        with self.client(server) as client:
            wait_for(lambda: client.info("replication")["role"] == "master", timeout, "the new master to take writes")
        return server

    def stop(self) -> None:
        for process in self.sentinel_processes:
            stop_process(process)
        for server in [*self.replicas, self.master]:
            if server is not None:
                server.stop()
