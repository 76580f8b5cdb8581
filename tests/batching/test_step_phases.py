"""Phase timing (`EngineConfig.phase_timing`): where an engine's iterations spend their time, in its stats."""

from __future__ import annotations

import time

import torch

from batching.step_phases import PHASES, StepPhases
from tests.support.engines import make_params


def test_phase_timing_reports_every_phase_of_steady_and_churn_iterations(fresh_engine):
    engine = fresh_engine(phase_timing=True, max_num_seqs=2, encode_overlap=False)
    # Two jobs of different lengths: both join (churn), run together (steady), one leaves (churn), one runs on.
    futures = [engine.submit(make_params(seed=seed, num_inference_steps=steps)) for seed, steps in ((1, 3), (2, 6))]
    for future in futures:
        future.result(timeout=120)
    engine.shutdown()  # a job resolves before its iteration ends: after the loop exits, every iteration has ended

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


class _Event:
    """Stands in for a CUDA event (a GPU is not lent here): records the wall clock, completes at once."""

    def __init__(self) -> None:
        self.at = time.perf_counter()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Event) -> float:
        return (end.at - self.at) * 1000


def test_device_spans_are_read_per_phase_and_between_iterations(monkeypatch):
    """The CUDA path's accounting, with events that complete at once: each phase's device time is the span
    between its two events, and the gap is the time between one iteration's last event and the next's first."""
    phases = StepPhases(torch.device("cpu"))
    phases.is_cuda = True
    monkeypatch.setattr(phases, "_record", _Event)
    for kind in ("churn", "steady", "steady"):
        phases.begin_iteration()
        if kind == "churn":
            phases.mark_churn()
        with phases.phase("forward"):
            time.sleep(0.01)
        with phases.phase("sampler"):
            pass
        phases.end_iteration(counted=True)
        time.sleep(0.005)

    summary = phases.summary()

    steady = summary["steady"]
    assert steady["iterations"] == steady["device_iterations"] == 2 and summary["churn"]["iterations"] == 1
    assert 9 <= steady["device_ms"]["forward"] <= steady["host_ms"]["forward"] + 1
    assert steady["device_ms"]["decode"] == 0.0, "a phase that did not run takes no device time"
    assert steady["device_gap_ms"] >= 4, "the device idled between the iterations"
