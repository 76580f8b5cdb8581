"""Real servers for tests, each on free loopback ports: a redis-server, moto's S3 server (where a test
injects faults), and SeaweedFS (where real S3 behaviour matters: signatures, presigned URLs)."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

from benchmarks import local_services
from benchmarks.local_services import stop_process
from tests.support.waiting import wait_for

# Ports for the servers tests start, below the kernel's ephemeral range (32768-60999 here): a port asked of the
# kernel (bind to 0) is free only until the next outgoing connection or another test process takes it, and the
# servers start seconds later. Each pytest-xdist worker (gw0, gw1, ...) walks a range of its own, from a random
# point so that two test runs on one machine seldom try the same port at once.
PORT_RANGE_START, PORT_RANGE_SIZE, PORT_RANGES = 20_000, 2_000, 6


def _port_range() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker.removeprefix("gw")) % PORT_RANGES if worker.startswith("gw") else 0
    start = PORT_RANGE_START + index * PORT_RANGE_SIZE
    return range(start, start + PORT_RANGE_SIZE)


_ports = _port_range()
_first = random.randrange(len(_ports))
_next_port = itertools.cycle([*_ports[_first:], *_ports[:_first]])


def free_port() -> int:
    """A loopback port nothing listens on, from this test process's own range (see above)."""
    for _ in range(len(_ports)):
        port = next(_next_port)
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # a server of this run, or of another, listens there
                continue
            return port
    raise RuntimeError(f"no free port in {_ports}")


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    def listening() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
        return False

    wait_for(listening, timeout, f"something to listen on port {port}", interval=0.05)


def wait_until_gone(processes: list, timeout: float = 10.0) -> list:
    """Wait (bounded) until each psutil.Process has exited; return those still alive (zombies count as gone)."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


class TlsFiles:
    """A certificate authority made for one test, and a server and a client certificate it signed (openssl)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.ca, self.ca_key = folder / "ca.pem", folder / "ca.key"
        self.server, self.server_key = folder / "server.pem", folder / "server.key"
        self.client, self.client_key = folder / "client.pem", folder / "client.key"
        self._openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=stepwise-test-ca",
                      "-keyout", self.ca_key, "-out", self.ca)  # fmt: skip
        self._sign(self.server, self.server_key, "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1")
        self._sign(self.client, self.client_key, "/CN=stepwise-client", "extendedKeyUsage=clientAuth")

    def _sign(self, cert: Path, key: Path, subject: str, extension: str) -> None:
        request = cert.with_suffix(".csr")
        self._openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-addext", extension,
                      "-keyout", key, "-out", request)  # fmt: skip
        self._openssl("x509", "-req", "-in", request, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial",
                      "-days", "2", "-copy_extensions", "copy", "-out", cert)  # fmt: skip

    @staticmethod
    def _openssl(*args: object) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)

    def client_query(self) -> str:
        """The query of a rediss:// URL that checks the server and shows the client's certificate."""
        return f"ssl_cert_reqs=required&ssl_ca_certs={self.ca}&ssl_certfile={self.client}&ssl_keyfile={self.client_key}"


class SeaweedS3Server(local_services.SeaweedS3Server):
    """The benchmarks' SeaweedFS S3 server (the tests' real S3), on ports from this test process's range."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.port = free_port()
        self.ports = {option: free_port() for option in self.PORT_OPTIONS}


class RedisServer:
    """A redis-server child process; `restart()` keeps its append-only data. With `tls`, it speaks only TLS
    and asks every client for a certificate its authority signed (redis-server's flags as in FACTS.md)."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        appendonly: bool = True,
        tls: TlsFiles | None = None,
        extra_arguments: tuple[str, ...] = (),  # more redis-server flags (a replica's --replicaof)
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.appendonly = appendonly
        self.tls = tls
        self.extra_arguments = extra_arguments
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}/0?{self.tls.client_query()}"
        return f"redis://127.0.0.1:{self.port}/0"

    def listen_arguments(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            *("--port", "0", "--tls-port", str(self.port)),
            *("--tls-cert-file", str(self.tls.server), "--tls-key-file", str(self.tls.server_key)),
            *("--tls-ca-cert-file", str(self.tls.ca), "--tls-auth-clients", "yes"),
        ]

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (make test installs it)"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary,
                *self.listen_arguments(),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.data_dir),
                "--appendonly",
                "yes" if self.appendonly else "no",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--daemonize",
                "no",
                "--logfile",
                str(self.data_dir / "redis.log"),
                *self.extra_arguments,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        client = redis.Redis.from_url(self.url)
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:  # noqa: PERF203
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            except redis.exceptions.BusyLoadingError:
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        stop_process(self.process)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


# moto keeps everything in memory; this serves S3 with `buckets` existing before the port opens.
MOTO_WITH_BUCKETS = """
import sys, threading
from moto.s3.models import s3_backends
from moto.server import ThreadedMotoServer
port, *buckets = sys.argv[1:]
for name in buckets:
    s3_backends["123456789012"]["global"].create_bucket(name, "us-east-1")
ThreadedMotoServer(ip_address="127.0.0.1", port=int(port)).start()
threading.Event().wait()
"""


class MotoS3Server:
    """moto's S3-compatible server over HTTP (it does not check signatures or expiry).

    With `buckets`, those exist from the moment the port opens, also after `restart()` (which
    loses every object: moto keeps nothing on disk)."""

    def __init__(self, port: int | None = None, buckets: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.buckets = buckets
        self.process: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoS3Server:
        if self.buckets:
            argv = [sys.executable, "-c", MOTO_WITH_BUCKETS, str(self.port), *self.buckets]
        else:
            argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port)
        return self

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        stop_process(self.process)
        self.process = None


S3_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def s3_env(endpoint_url: str, bucket: str) -> dict[str, str]:
    return {**S3_TEST_ENV, "STEPWISE_S3_ENDPOINT_URL": endpoint_url, "STEPWISE_STORAGE_URL": f"s3://{bucket}/images"}


def child_env(**overrides: str) -> dict[str, str]:
    """The environment for a child process of a test, with STEPWISE_* cleared first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWISE_")}
    env.update(overrides)
    return env


@contextlib.contextmanager
def silent_tcp_server():
    """A loopback TCP server that accepts connections and never sends a byte (a TLS handshake that stalls).
    Yields the listening socket."""
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener
    finally:
        listener.close()
        for connection in held:
            connection.close()
