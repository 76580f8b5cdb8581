"""`stepwise bench` end to end at the smallest size: every output exists and is well-formed.

One `stepwise bench --smoke` run (builtin:tiny, a few 2-step jobs, `stepwise up` for the
end-to-end part) serves the module. The tests check shapes, keys and types, never the
measured values: those depend on the machine and its load.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from numbers import Real

import pytest
from PIL import Image

from tests.support.servers import child_env

VARIANTS = {"serial", "static", "fifo", "default"}
WORKLOADS = {
    "burst",
    "poisson_1x",
    "poisson_3x",
    "mixed_steps",
    "two_resolution",
    "mixed_guidance",
    "mixed_size",
    "mixed_size_uniform",
}
MACHINE_KEYS = {"cpu_count", "cpu_model", "torch", "diffusers", "device", "torch_num_threads"}
METRIC_KEYS = {
    "num_jobs",
    "wall_seconds",
    "throughput_images_per_second",
    "latency_seconds",
    "queue_wait_seconds",
    "mean_rows_per_forward",
    "efficiency",
}
PERCENTILE_KEYS = {"mean", "p50", "p95", "p99", "max"}

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="the e2e part needs redis-server")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    completed = subprocess.run(
        [sys.executable, "-m", "stepwise_cli.main", "bench", "--smoke", "--models", "builtin:tiny", "--out", str(out)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return out


def is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def test_summary_has_every_variant_on_every_workload_with_its_metrics(results):
    summary = json.loads((results / "summary.json").read_text())

    assert MACHINE_KEYS <= summary["machine"].keys()
    assert is_number(summary["load_average"]["one_minute_mean"])
    [model] = summary["models"]
    assert {(r["workload"], r["variant"]) for r in model["runs"]} == {(w, v) for w in WORKLOADS for v in VARIANTS}
    for run in model["runs"]:
        assert METRIC_KEYS <= run["metrics"].keys()
        assert PERCENTILE_KEYS <= run["metrics"]["latency_seconds"].keys()
        assert (run["metrics"]["efficiency"] is None) == (run["variant"] == "static")
    headlines = summary["headlines"]["builtin:tiny"]
    for name in (
        "throughput_default_over_serial_burst",
        "throughput_default_over_static_burst",
        "throughput_default_over_fifo_two_resolution",
        "engine_efficiency_default_burst",
    ):
        assert is_number(headlines[name]), name
    assert set(headlines["throughput_mixed_over_uniform_equal_tokens"]) == VARIANTS
    assert all(is_number(value) for value in headlines["throughput_mixed_over_uniform_equal_tokens"].values())


def test_every_run_file_records_the_machine_and_the_load_average(results):
    files = sorted((results / "runs").glob("*.json"))

    assert len(files) == len(WORKLOADS) * len(VARIANTS) + 2  # + the two end-to-end runs
    for path in files:
        document = json.loads(path.read_text())
        assert document["schema"].startswith("stepwise-bench-"), path.name
        assert MACHINE_KEYS <= document["machine"].keys(), path.name
        assert all(len(document["load_average"][when]) == 3 for when in ("start", "end")), path.name
        assert document["jobs"] and document["metrics"], path.name


def test_end_to_end_runs_report_overhead_and_submit_throughput(results):
    e2e = json.loads((results / "summary.json").read_text())["e2e"]

    assert "error" not in e2e
    assert set(e2e["runs"]) == {"burst", "poisson_1x"}
    for run in e2e["runs"].values():
        assert run["num_succeeded"] == run["num_jobs"]
        assert PERCENTILE_KEYS <= run["overhead_seconds"].keys()
    assert is_number(e2e["api_submit"]["requests_per_second"])


def test_the_shapes_checker_accuracy_is_reported_beside_throughput_alone_and_co_batched(results):
    summary = json.loads((results / "summary.json").read_text())
    shapes = summary["correctness"]

    assert shapes["model"] == "builtin:shapes" and shapes["num_cases"] == 3
    for mode in ("alone", "co_batched"):
        assert 0 <= shapes[mode]["num_passed"] <= 3 and is_number(shapes[mode]["images_per_second"])
        assert len(shapes[mode]["failures"]) == 3 - shapes[mode]["num_passed"]
    assert "## Correctness: builtin:shapes" in (results / "results.md").read_text()


def test_markdown_links_only_files_that_exist(results):
    text = (results / "results.md").read_text()

    assert text.startswith("# stepwise benchmark results")
    assert "Load average" in text
    for variant in VARIANTS:
        assert f"| {variant} |" in text
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert any(link.endswith(".png") for link in links) and any(link.endswith(".json") for link in links)
    for link in links:
        assert (results / link).is_file(), link


def test_plots_are_readable_png_images(results):
    names = {path.name for path in results.glob("*.png")}

    assert names == {"throughput_vs_rate.png", "latency_cdf_tiny.png"}
    for name in names:
        with Image.open(results / name) as image:
            image.verify()
            assert image.format == "PNG"


@pytest.mark.parametrize("batch", [0, 5])
def test_the_submit_profile_reports_cpu_per_request_and_a_profile(batch):
    """`python -m benchmarks.submit_profile`: its own redis-server, the app in process; every
    profiled submit must be accepted (the script asserts 202/200), and it prints what it measured."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is needed: `make install-test` installs it")
    argv = [sys.executable, "-m", "benchmarks.submit_profile", "--requests", "20", "--top", "3", "--batch", str(batch)]
    done = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    path = "/v1/jobs/batch" if batch else "/v1/jobs"
    line = rf"^{re.escape(path)}: \d+\.\d+ ms of CPU per request \(\d+ us per job\), 20 requests$"
    assert re.search(line, done.stdout, re.M)
    assert "function calls" in done.stdout
