"""Worker metrics in Prometheus format, served on `STEPWISE_WORKER_METRICS_PORT`.

The exporter has no authentication, so it listens on `STEPWISE_WORKER_METRICS_HOST`, 127.0.0.1
unless a deployment exposes it on purpose (compose sets 0.0.0.0 for Prometheus on its network).

Job-level metrics are observed on job threads. Engine metrics (rows per forward, running
and waiting jobs, steps per second) are read from `engine.stats()` when Prometheus scrapes,
so the engine loop thread does no metrics work at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STEP_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

JOBS = Counter("stepwise_worker_jobs", "Jobs this worker handled, by outcome", ["outcome"])
QUEUE_WAIT = Histogram(
    "stepwise_worker_queue_wait_seconds", "From job creation until the engine admitted it", buckets=SECONDS_BUCKETS
)
STEP_LATENCY = Histogram(
    "stepwise_worker_step_seconds",
    "Time between two denoise steps of one job (one engine iteration)",
    buckets=STEP_BUCKETS,
)
UPLOAD_SECONDS = Histogram(
    "stepwise_worker_upload_seconds", "PNG encoding and upload of one job's images", buckets=SECONDS_BUCKETS
)
JOB_SECONDS = Histogram(
    "stepwise_worker_job_seconds", "From job creation until its record reached an end", buckets=SECONDS_BUCKETS
)


class EngineCollector(Collector):
    """Turns the engine's cumulative counters into Prometheus metrics at scrape time."""

    def __init__(self, read_stats: Callable[[], dict[str, Any] | None]) -> None:
        self.read_stats = read_stats

    def collect(self):
        stats = self.read_stats()
        if not stats:
            return
        yield _histogram(
            "stepwise_engine_rows_per_forward",
            "Rows carried by each denoiser forward",
            stats.get("rows_per_forward") or {},
        )
        yield _histogram(
            "stepwise_engine_jobs_per_forward",
            "Jobs sharing each denoiser forward",
            stats.get("jobs_per_forward") or {},
        )
        for name, help_text, key in (
            ("stepwise_engine_running_jobs", "Jobs in the running batch", "num_running"),
            ("stepwise_engine_waiting_jobs", "Jobs submitted to the engine and not yet admitted", "num_waiting"),
            (
                "stepwise_engine_steps_per_second",
                "Denoise steps per second of busy engine time, all jobs",
                "steps_per_second",
            ),
        ):
            if isinstance(stats.get(key), (int, float)):
                yield GaugeMetricFamily(name, help_text, value=float(stats[key]))
        step_cache = stats.get("step_cache") or {}
        if step_cache:
            skipped = GaugeMetricFamily(
                "stepwise_engine_step_cache_skipped_fraction",
                "Fraction of denoiser block evaluations skipped by step-cached jobs, per family",
                labels=["family"],
            )
            for family, figures in step_cache.items():
                skipped.add_metric([family], float(figures.get("skipped_fraction", 0.0)))
            yield skipped


def _histogram(name: str, help_text: str, counts: dict[Any, int]) -> HistogramMetricFamily:
    """A Prometheus histogram from {value: count} (keys may be strings after JSON)."""
    pairs = sorted((int(value), int(count)) for value, count in counts.items())
    buckets = []
    for bound in ROWS_BUCKETS:
        buckets.append((str(bound), sum(count for value, count in pairs if value <= bound)))
    total = sum(count for _, count in pairs)
    buckets.append(("+Inf", total))
    return HistogramMetricFamily(
        name, help_text, buckets=buckets, sum_value=float(sum(value * count for value, count in pairs))
    )


class SpoolCollector:
    """The spool (worker.spool), read when Prometheus scrapes: jobs and bytes waiting for image storage, and
    whether it is full (the worker then takes no job)."""

    def __init__(self, read_stats: Callable[[], dict[str, Any]]) -> None:
        self.read_stats = read_stats

    def collect(self):
        stats = self.read_stats()
        yield GaugeMetricFamily("stepwise_spool_jobs", "Jobs whose images wait for image storage", stats["num_jobs"])
        yield GaugeMetricFamily("stepwise_spool_bytes", "Bytes of images waiting for image storage", stats["num_bytes"])
        yield GaugeMetricFamily("stepwise_spool_full", "1 while the spool is full: no job is taken", stats["is_full"])


def watch_spool(read_stats: Callable[[], dict[str, Any]]) -> None:
    REGISTRY.register(SpoolCollector(read_stats))


def start_exporter(host: str, port: int, read_stats: Callable[[], dict[str, Any] | None]) -> None:
    """Serve /metrics on host:port (port 0: off). A busy port is logged, not fatal: the worker still works."""
    REGISTRY.register(EngineCollector(read_stats))
    if port <= 0:
        return
    try:
        start_http_server(port, addr=host)
    except OSError as e:
        log.error("worker metrics: cannot listen on %s:%d (%s); set STEPWISE_WORKER_METRICS_HOST/_PORT", host, port, e)
        return
    log.info("worker metrics on http://%s:%d/metrics", host, port)
