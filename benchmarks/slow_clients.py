"""How the API serves health checks and authenticated clients while slow clients hold sockets.

    python -m benchmarks.slow_clients --num-slow 50 --mode headers
    python -m benchmarks.slow_clients --num-slow 50 --mode body

Starts its own redis-server and `stepwise api` on loopback, opens `--num-slow` connections
that send their request head (`headers`) or body (`body` without an API key, `auth-body`
with one, `auth-upload` a 2 MB image upload with one) one line or byte every
`--trickle-interval` seconds, and meanwhile probes `GET /healthz` and an authenticated
`GET /v1/jobs` every `--probe-interval` with a 2 s client timeout. Prints one JSON line:
probes answered, their median and worst latency, how many slow sockets the server closed, and
the API's resident memory (all its processes) before the slow clients and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import requests

from benchmarks.local_services import free_port, redis_server, stop_process, wait_until

KEY = "sk_slow_clients_probe"


def trickle(port: int, mode: str, interval: float, stop: threading.Event, closed: list[int]) -> None:
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if mode == "headers":
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            chunk = b"X-Slow: 1\r\n"
        elif mode == "auth-upload":  # an image upload over the JSON routes' limit: the app reads it itself
            sock.sendall(
                b"POST /v1/uploads HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                + f"Authorization: Bearer {KEY}\r\n".encode()
                + b"Content-Length: 2000000\r\n\r\n"
            )
            chunk = b"\0"
        else:  # body: unauthenticated (refused before the app reads it); auth-body: read by the app
            key = f"Authorization: Bearer {KEY}\r\n".encode() if mode == "auth-body" else b""
            sock.sendall(
                b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + key
                + b"Content-Length: 100000\r\n\r\n"
            )
            chunk = b" "
        while not stop.wait(interval):
            sock.sendall(chunk)
    except OSError:
        closed.append(1)  # the server closed it (a read deadline), or refused it
        return
    sock.close()


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and its descendants (Linux /proc), in MiB."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
            with open(f"/proc/{current}/task/{current}/children") as children:
                pending.extend(int(child) for child in children.read().split())
        except (OSError, StopIteration):
            continue
    return round(total / 1024, 1)


def probe(url: str, headers: dict[str, str]) -> float | None:
    started = time.monotonic()
    try:
        response = requests.get(url, headers=headers, timeout=2)
    except requests.RequestException:
        return None
    return time.monotonic() - started if response.status_code == 200 else None


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="stepwise-slow-") as work, redis_server(work) as redis_url:
        return measure_api(args, work, redis_url)


def measure_api(args: argparse.Namespace, work: str, redis_url: str) -> dict:
    api_port = free_port()
    env = {
        **os.environ,
        "STEPWISE_REDIS_URL": redis_url,
        "STEPWISE_STORAGE_URL": f"file://{work}/images",
        "STEPWISE_API_KEYS": f"probe:{KEY}",
    }
    api = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepwise_cli.main",
            "api",
            "--port",
            str(api_port),
            "--workers",
            str(args.workers),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{api_port}"
    stop = threading.Event()
    closed: list[int] = []
    try:
        wait_until(lambda: requests.get(f"{base}/healthz", timeout=1).ok, 60, "the API")
        slow = [
            threading.Thread(
                target=trickle, args=(api_port, args.mode, args.trickle_interval, stop, closed), daemon=True
            )
            for _ in range(args.num_slow)
        ]
        for thread in slow:
            thread.start()
        rss_before = tree_rss_mib(api.pid)
        time.sleep(1.0)  # let every slow socket connect and start its request
        health, listing = [], []
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline:
            health.append(probe(f"{base}/healthz", {}))
            listing.append(probe(f"{base}/v1/jobs", {"Authorization": f"Bearer {KEY}"}))
            time.sleep(args.probe_interval)
        rss_during = tree_rss_mib(api.pid)
    finally:
        stop.set()
        stop_process(api, 20)

    def summary(latencies: list[float | None]) -> dict:
        answered = [latency for latency in latencies if latency is not None]
        return {
            "answered": f"{len(answered)}/{len(latencies)}",
            "median_ms": round(statistics.median(answered) * 1000, 1) if answered else None,
            "max_ms": round(max(answered) * 1000, 1) if answered else None,
        }

    return {
        "workers": args.workers,
        "mode": args.mode,
        "num_slow": args.num_slow,
        "duration_s": args.duration,
        "healthz": summary(health),
        "authenticated_list": summary(listing),
        "slow_sockets_closed_by_server": len(closed),
        "api_rss_mib": {"before": rss_before, "with_slow_clients": rss_during},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mode", choices=("headers", "body", "auth-body", "auth-upload"), default="headers")
    parser.add_argument("--num-slow", type=int, default=50)
    parser.add_argument("--trickle-interval", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--probe-interval", type=float, default=0.5)
    print(json.dumps(measure(parser.parse_args())))


if __name__ == "__main__":
    main()
