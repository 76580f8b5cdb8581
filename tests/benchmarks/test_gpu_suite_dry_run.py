"""The prepared GPU run (benchmarks/gpu/run.sh) in its CPU dry run: it completes and reports every figure.

The dry run builds the same model structures at tiny widths and runs every section once,
so the script that will run on a GPU machine cannot rot unnoticed. Values depend on the
machine; the test checks that each figure is there and well-formed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import child_env

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {"serial", "static", "default"}
ROWS = [1, 2, 4, 8, 16]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-dry-run")
    completed = subprocess.run(
        [str(ROOT / "benchmarks/gpu/run.sh"), "--suite", "gpu", "--dry-run", str(out)],
        env=child_env(PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads((out / "gpu_results.json").read_text()), (out / "gpu_summary.md").read_text()


def _is_positive(value) -> bool:
    return isinstance(value, (int, float)) and value > 0


def test_the_dry_run_measures_every_section_for_both_unet_models_and_the_flux_and_wan_transformers(dry_run):
    results, _ = dry_run
    assert results["skipped"] == []
    assert set(results["models"]) == {"sd15", "sdxl"}
    for name, model in results["models"].items():
        assert [row["rows"] for row in model["forward_ceiling"]] == ROWS, name
        assert all(
            _is_positive(row["seconds"]) and _is_positive(row["rows_per_second"]) for row in model["forward_ceiling"]
        )
        for workload in ("burst", "poisson"):
            assert set(model["throughput"][workload]) == VARIANTS, (name, workload)
            for figures in model["throughput"][workload].values():
                assert _is_positive(figures["throughput_images_per_second"])
                assert figures["num_jobs"] == model["run"]["num_jobs"]
        assert set(model["invariance"]) == {results["profile"]["dtype"], "deterministic"}
        invariance = model["invariance"]
        assert invariance["deterministic"] == 0, "deterministic mode: bit-identical alone and batched"
        assert isinstance(invariance[results["profile"]["dtype"]], int)
        # float32 without deterministic mode: rounding that follows the batch's make-up, which follows arrival
        # timing (measured 0-1 levels alone, 3 once in a loaded suite); another job's image is 213-255 levels away
        assert 0 <= invariance[results["profile"]["dtype"]] <= 8, "batch invariance: rounding, not another image"
        overlap = model["decode_overlap"]
        assert overlap["off"]["decode_overlap"] is False and overlap["on"]["decode_overlap"] is True
        for figures in overlap.values():
            assert _is_positive(figures["images_per_second"]) and 0 < figures["denoiser_busy_fraction"] <= 1.5
        encode = model["encode_overlap"]
        assert encode["off"]["encode_overlap"] is False and encode["on"]["encode_overlap"] is True
        for figures in encode.values():
            assert figures["num_jobs"] == 1 + model["run"]["num_jobs"] // 2
            assert _is_positive(figures["max_stall_seconds"]) and _is_positive(figures["encode_seconds_per_job"])
            assert figures["max_stall_seconds"] >= figures["median_step_gap_seconds"]
        assert sum(model["parameters"].values()) > 0
    assert [row["rows"] for row in results["flux"]["forward_ceiling"]] == ROWS
    wan = results["wan"]
    assert [row["rows"] for row in wan["uniform"]] == [1, 2, 4]
    assert all(_is_positive(row["seconds"]) and _is_positive(row["speedup"]) for row in wan["uniform"])
    assert _is_positive(wan["mixed"]["seconds"]) and _is_positive(wan["mixed"]["alone_seconds"])
    assert wan["mixed"]["relative_difference"] < 1e-4, "a mixed video row computes what it would alone"


def test_the_dry_run_summary_shows_each_section(dry_run):
    _, summary = dry_run
    for heading in (
        "## sd15 at 64x64",
        "## sdxl at 64x64",
        "## FLUX-sized transformer alone",
        "## Wan-sized video transformer alone",
        "| serial |",
        "| static |",
        "| default |",
        "Invariance",
        "Decode overlap",
        "Encode overlap",
    ):
        assert heading in summary
