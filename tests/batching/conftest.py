"""Session-scoped engines on the built-in tiny model (CPU), and an engine of a test's own.

Engines are shared across tests to keep the suite fast; a test that changes an
engine's state for good (shutdown, a broken model) builds its own (`fresh_engine`).
"""

from __future__ import annotations

import pytest

from batching import DiffusionEngine, EngineConfig


# The solo engine starts jobs inline and the batched one beside the loop (batching.encoder): a test that holds
# a batched image against the same job alone covers both ways of encoding prompts.
@pytest.fixture(scope="session")
def solo_engine():
    engine = DiffusionEngine(EngineConfig(device="cpu", max_num_seqs=1, encode_overlap=False))
    yield engine
    engine.shutdown(abort=True)


@pytest.fixture(scope="session")
def batched_engine():
    engine = DiffusionEngine(EngineConfig(device="cpu", max_num_seqs=8, encode_overlap=True))
    yield engine
    engine.shutdown(abort=True)


@pytest.fixture(scope="session")
def deterministic_engine():
    engine = DiffusionEngine(EngineConfig(device="cpu", max_num_seqs=4, deterministic=True, encode_overlap=True))
    yield engine
    engine.shutdown(abort=True)


@pytest.fixture
def fresh_engine():
    """An engine of the test's own, for tests that break or shut it down."""
    engines = []

    def build(**overrides) -> DiffusionEngine:
        engine = DiffusionEngine(EngineConfig(**{"device": "cpu", "max_num_seqs": 4, **overrides}))
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.shutdown(abort=True)
