"""Operating a worker with Celery's own tools, and its Prometheus metrics."""

from __future__ import annotations

import socket

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from storage.job_record import JobState
from tests.support.cluster import long_params, small_params

pytestmark = [pytest.mark.workers, pytest.mark.xdist_group("s3-cluster")]  # one `s3_cluster` for these files


@pytest.mark.timeout(600)
def test_drain_stops_admission_while_in_flight_jobs_finish_and_resume_restarts_it(s3_cluster, main_worker):
    in_flight_id = s3_cluster.submit(long_params(prompt="in flight"))
    s3_cluster.wait_for_progress(in_flight_id, min_step=1)

    drained = s3_cluster.celery_cli("control", "drain", "-d", main_worker.name, "-t", "10")
    assert drained.returncode == 0 and "draining" in drained.stdout, drained.stdout + drained.stderr
    try:
        held_id = s3_cluster.submit(small_params(prompt="sent while drained"))
        assert s3_cluster.wait_for_end(in_flight_id).state is JobState.SUCCEEDED
        stats = s3_cluster.command(main_worker, "engine_stats")
        queue_names = [q["name"] for q in s3_cluster.command(main_worker, "active_queues")]  # webhook deliveries
        # The in-flight job ran to its end meanwhile: a consuming worker would have taken this one.
        assert s3_cluster.store.get(held_id).state is JobState.QUEUED
        assert stats["is_admitting"] is False and stats["is_admission_paused"] is True
        assert queue_names == ["stepwise.webhooks"]  # they go on: only the feeder stopped taking jobs
    finally:
        resumed = s3_cluster.celery_cli("control", "resume", "-d", main_worker.name, "-t", "10")
    assert resumed.returncode == 0 and "admitting" in resumed.stdout, resumed.stdout + resumed.stderr

    assert s3_cluster.wait_for_end(held_id).state is JobState.SUCCEEDED
    assert s3_cluster.command(main_worker, "engine_stats")["is_admitting"] is True


def test_engine_stats_reports_batching_per_key_throughput_and_the_model(s3_cluster, main_worker):
    result = s3_cluster.celery_cli("inspect", "engine_stats", "-d", main_worker.name, "-t", "10")

    assert result.returncode == 0, result.stdout + result.stderr
    for field in (
        "rows_per_forward",
        "jobs_per_forward",
        "running_by_key",
        "num_waiting",
        "steps_per_second",
        "builtin:tiny",
    ):
        assert field in result.stdout


def test_worker_metrics_are_served_in_prometheus_format(s3_cluster, main_worker):
    job_id = s3_cluster.submit(small_params(prompt="measured"))
    assert s3_cluster.wait_for_end(job_id).state is JobState.SUCCEEDED

    text = requests.get(f"http://127.0.0.1:{main_worker.metrics_port}/metrics", timeout=10).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    assert samples[("stepwise_worker_jobs_total", (("outcome", "succeeded"),))] >= 1
    assert samples[("stepwise_engine_rows_per_forward_count", ())] >= 1
    assert samples[("stepwise_worker_step_seconds_count", ())] >= 1
    assert samples[("stepwise_worker_queue_wait_seconds_count", ())] >= 1
    assert samples[("stepwise_worker_upload_seconds_count", ())] >= 1


def test_a_plain_celery_worker_gets_threads_sized_from_max_num_seqs_late_acks_and_prefetch_one(s3_cluster, main_worker):
    stats = s3_cluster.command(main_worker, "stats")
    conf = s3_cluster.command(main_worker, "conf")

    assert "thread" in stats["pool"]["implementation"]
    assert stats["pool"]["max-concurrency"] == 12  # max_num_seqs 8 + 4 waiting: jobs held, and deliveries at once
    assert stats["prefetch_count"] == 12  # multiplier 1: one delivery per thread
    assert conf["task_acks_late"] is True and conf["task_reject_on_worker_lost"] is True
    assert conf["broker_transport_options"]["visibility_timeout"] == 7200
    assert conf["worker_send_task_events"] is True


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on `port` on this machine (Linux /proc/net)."""
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    raw = bytes.fromhex(address)
                    addresses.add(
                        socket.inet_ntop(
                            socket.AF_INET if len(raw) == 4 else socket.AF_INET6,
                            b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)),
                        )
                    )
    return addresses


def test_worker_metrics_listen_on_loopback_unless_exposed_on_purpose(main_worker):
    """The exporter has no authentication: STEPWISE_WORKER_METRICS_HOST=0.0.0.0 exposes it, nothing else."""
    assert listening_addresses(main_worker.metrics_port) == {"127.0.0.1"}


def test_a_worker_without_an_engine_answers_inspect_and_control_with_a_plain_ok_not_an_error(s3_cluster):
    webhooks = s3_cluster.start_worker(
        "webhooks-only", via_stepwise=True, stepwise_args=("--queues", "stepwise.webhooks")
    )
    try:
        for command in (("inspect", "engine_stats"), ("control", "drain"), ("control", "resume")):
            result = s3_cluster.celery_cli(*command, "-d", webhooks.name, "-t", "10")

            assert result.returncode == 0, result.stdout + result.stderr
            assert "ERROR" not in result.stdout and "no engine here" in result.stdout, result.stdout
    finally:
        webhooks.stop()
