"""Prometheus metrics: request latency and counts per route, jobs by state and queue depth.

Only an admin API key reads them (STEPWISE_ADMIN_API_KEYS, or `stepwise keys create --admin`): they
count every tenant's jobs. No series carries a tenant's name unless the operator asks for one
(STEPWISE_METRICS_TENANT_LABELS: `stepwise_tenant_jobs{tenant, state}`).

Job counts are read from Redis at scrape time, so every API process reports the same
numbers. Request metrics live in each process; under `stepwise api` (several granian
worker processes) PROMETHEUS_MULTIPROC_DIR is set and a scrape aggregates all workers.
"""

from __future__ import annotations

import logging
import os
import time

from flask import Blueprint, Flask, Response, g, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from api.auth import require_admin
from api.openapi_operations import Answer, documented
from api.resources import get_job_store, get_settings
from storage.errors import StorageError
from storage.job_store import JobStore

log = logging.getLogger(__name__)

bp = Blueprint("metrics", __name__)
bp.before_request(require_admin)

# Not registered in prometheus_client's global registry: each scrape builds its own.
REQUEST_LATENCY = Histogram(
    "stepwise_api_request_duration_seconds",
    "Time to answer an API request.",
    ["method", "route"],
    registry=None,
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
REQUESTS = Counter("stepwise_api_requests", "API requests answered.", ["method", "route", "status"], registry=None)


class JobStoreCollector:
    """Jobs by state and queue depth, read from Redis on each scrape."""

    def __init__(self, store: JobStore, *, with_tenant_labels: bool = False) -> None:
        self.store = store
        self.with_tenant_labels = with_tenant_labels  # STEPWISE_METRICS_TENANT_LABELS: the operator asked

    def collect(self):
        up = GaugeMetricFamily("stepwise_redis_up", "Whether the API could read job counts from Redis.")
        try:
            counts = self.store.counts_by_state()
        except StorageError as e:
            log.warning("metrics: cannot read job counts: %s", e)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily(
            "stepwise_jobs",
            "Jobs by state: queued and running now; terminal states counted since the start.",
            labels=["state"],
        )
        for state, count in counts.items():
            jobs.add_metric([state], count)
        yield jobs
        yield GaugeMetricFamily("stepwise_queue_depth", "Jobs waiting for a worker.", value=counts["queued"])
        if self.with_tenant_labels:
            tenants = GaugeMetricFamily(
                "stepwise_tenant_jobs", "Each tenant's queued and running jobs.", labels=["tenant", "state"]
            )
            for tenant, by_state in self.store.tenant_totals().items():
                for state, count in by_state.items():
                    tenants.add_metric([tenant, state], count)
            yield tenants


def route_label() -> str:
    return request.url_rule.rule if request.url_rule is not None else "unmatched"


def start_timer() -> None:
    g.request_started = time.perf_counter()


def observe(response: Response) -> Response:
    started = g.pop("request_started", None)
    if started is not None:
        route = route_label()
        REQUEST_LATENCY.labels(request.method, route).observe(time.perf_counter() - started)
        REQUESTS.labels(request.method, route, str(response.status_code)).inc()
    return response


@bp.get("/metrics")
@documented(
    "Prometheus metrics (an admin API key).",
    responses={200: Answer("Prometheus text format.", content={"text/plain": {"schema": {"type": "string"}}})},
)
def metrics():
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)
    else:
        registry.register(REQUEST_LATENCY)
        registry.register(REQUESTS)
    registry.register(JobStoreCollector(get_job_store(), with_tenant_labels=get_settings().metrics_tenant_labels))
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)


def register(app: Flask) -> None:
    app.before_request(start_timer)
    app.after_request(observe)
    app.register_blueprint(bp)
