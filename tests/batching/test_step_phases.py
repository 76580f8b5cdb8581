"""Phase timing (`EngineConfig.phase_timing`): where an engine's iterations spend their time, in its stats."""

from __future__ import annotations

from batching.step_phases import PHASES
from tests.support.engines import make_params


def test_phase_timing_reports_every_phase_of_steady_and_churn_iterations(fresh_engine):
    engine = fresh_engine(phase_timing=True, max_num_seqs=2, encode_overlap=False)
    # Two jobs of different lengths: both join (churn), run together (steady), one leaves (churn), one runs on.
    futures = [engine.submit(make_params(seed=seed, num_inference_steps=steps)) for seed, steps in ((1, 3), (2, 6))]
    for future in futures:
        future.result(timeout=120)

    stats = engine.stats()
    phases = stats["phases"]
    assert set(phases) == {"steady", "churn"}
    assert phases["steady"]["iterations"] + phases["churn"]["iterations"] == stats["iterations"]
    for kind in phases.values():
        assert set(kind["host_ms"]) == set(PHASES) and set(kind["cpu_ms"]) == set(PHASES)
        assert kind["host_ms"]["forward"] > 0
        assert sum(kind["host_ms"].values()) <= kind["wall_ms"] * 1.001  # the phases are parts of the iteration
    assert phases["churn"]["host_ms"]["start"] > phases["steady"]["host_ms"]["start"]  # prompts encode at joins


def test_without_phase_timing_stats_carry_no_phases(batched_engine):
    assert "phases" not in batched_engine.stats()
