"""The prepared serving suite (benchmarks/gpu/run.sh, `benchmarks.gpu.serving`) in its CPU dry run: it completes
and writes serving.json in the shape of DESIGN.md section 9, its table, and the engine's phase profile.

The dry run serves three families' tiny built-ins (a UNet, a transformer that mixes sizes, a video model) the
three ways the GPU run does, so the script that will run on a GPU machine cannot rot unnoticed. Values depend on
the machine; the test checks that each figure is there and well-formed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from batching.step_phases import PHASES
from benchmarks.gpu.serving_report import shape_errors
from tests.support.servers import child_env

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = {"burst", "poisson_1x", "poisson_2x"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("serving-dry-run")
    completed = subprocess.run(
        [str(ROOT / "benchmarks/gpu/run.sh"), "--dry-run", str(out)],
        env=child_env(PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return (
        json.loads((out / "serving.json").read_text()),
        json.loads((out / "serving_details.json").read_text()),
        (out / "serving.md").read_text(),
    )


def _is_positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def test_serving_json_has_the_design_shape_for_a_unet_a_transformer_and_a_video_family(dry_run):
    document, details, _ = dry_run
    assert set(document) == {"machine", "families"}
    assert isinstance(document["machine"]["cuda_device"], str) and document["machine"]["torch"].startswith("2.")
    assert set(document["families"]) == {"sd15", "flux", "wan"} and details["skipped"] == []
    for name, family in document["families"].items():
        assert isinstance(family["height"], int) and isinstance(family["width"], int), name
        assert set(family["workloads"]) == WORKLOADS == set(family["device_busy"]), name
        for variants in family["workloads"].values():
            assert set(variants) == {"serial", "static", "default"}
            for figures in variants.values():
                assert set(figures) == {"throughput_images_per_second", "latency_seconds"}
                assert _is_positive(figures["throughput_images_per_second"])
                assert set(figures["latency_seconds"]) == {"p50", "p95"}
                assert 0 < figures["latency_seconds"]["p50"] <= figures["latency_seconds"]["p95"]
        assert all(0 < busy <= 1.5 for busy in family["device_busy"].values()), name
    assert "num_frames" not in document["families"]["sd15"] and document["families"]["wan"]["num_frames"] == 5
    assert "mixed_shapes_vs_alone" not in document["families"]["sd15"], "a UNet family runs one size a forward"
    assert all(_is_positive(document["families"][name]["mixed_shapes_vs_alone"]) for name in ("flux", "wan"))
    assert shape_errors(document) == []


def test_the_default_engines_phase_profile_is_in_the_details_for_each_workload(dry_run):
    _, details, _ = dry_run
    for name, family in details["families"].items():
        for workload in WORKLOADS:
            phases = family["runs"]["default"][workload]["phases"]
            assert phases and set(phases) <= {"steady", "churn"}, (name, workload)
            for kind in phases.values():
                assert set(kind["host_ms"]) == set(PHASES) and kind["host_ms"]["forward"] > 0
        assert family["num_jobs"] == 3 and _is_positive(family["one_job_static_seconds"])


def test_the_table_has_a_row_per_family_and_workload_and_each_familys_phase_tables(dry_run):
    _, _, table = dry_run
    summary = table.split("\n## ")[0]
    rows = [line for line in summary.splitlines() if line.startswith("| ") and "workload" not in line]
    assert len(rows) == 3 * 3 + 2, "three workloads each, and the mixed-shape rows of flux and wan"
    for name in ("sd15", "flux", "wan"):
        assert f"## {name}: the default engine's iteration, phase by phase" in table
    assert table.count("| sampler |") == 3 * 2, "host and loop-thread CPU tables for each family (CPU: no device)"


def test_the_shape_check_names_what_departs_from_the_design():
    document = {
        "machine": {"cuda_device": "NVIDIA H100", "torch": "2.11.0"},
        "families": {
            "sd15": {
                "height": 512,
                "width": 512,
                "workloads": {"burst": {"default": {"throughput_images_per_second": 6.7, "latency_seconds": {}}}},
                "device_busy": {"burst": 0.9},
                "rows": 16,
            },
            "sd2": {},
        },
    }
    errors = shape_errors(document)
    assert "families.sd15.rows: not in the shape" in errors
    assert "families.sd15.workloads.burst.default.latency_seconds must hold numbers p50 and p95" in errors
    assert any(error.startswith("families.sd2: not a family name") for error in errors)
    assert shape_errors({"machine": {}, "families": {}}) == [
        "machine.cuda_device must be a string",
        "machine.torch must be a string",
    ]
