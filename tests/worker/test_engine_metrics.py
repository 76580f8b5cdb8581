"""The engine's and the spool's figures as Prometheus reads them at scrape time (worker.metrics)."""

from __future__ import annotations

from worker.metrics import EngineCollector, SpoolCollector


def test_the_step_cache_skipped_fraction_is_a_gauge_per_family():
    stats = {"num_running": 3, "step_cache": {"zimage": {"skipped_fraction": 0.54, "blocks": 600}}}

    metrics = {metric.name: metric for metric in EngineCollector(lambda: stats).collect()}

    samples = metrics["stepwise_engine_step_cache_skipped_fraction"].samples
    assert [(sample.labels, sample.value) for sample in samples] == [({"family": "zimage"}, 0.54)]
    assert metrics["stepwise_engine_running_jobs"].samples[0].value == 3


def test_an_engine_without_a_step_cache_exports_no_skipped_fraction():
    metrics = {metric.name for metric in EngineCollector(lambda: {"step_cache": {}}).collect()}

    assert "stepwise_engine_step_cache_skipped_fraction" not in metrics


def test_the_spool_is_exported_as_gauges_of_jobs_bytes_and_whether_it_is_full():
    stats = {"num_jobs": 3, "num_bytes": 4096, "max_bytes": 4000, "is_full": True, "storage_error": "S3 is down"}

    metrics = {metric.name: metric.samples[0].value for metric in SpoolCollector(lambda: stats).collect()}

    assert metrics == {"stepwise_spool_jobs": 3, "stepwise_spool_bytes": 4096, "stepwise_spool_full": 1}
