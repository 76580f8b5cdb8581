"""One OpenMP thread for the test process and every process it starts (they inherit the environment), set when
tests/conftest.py imports this module, before anything imports torch.

The suite runs several processes per core (pytest-xdist workers and the API, worker and benchmark processes
they start). torch's default of a thread per core makes each parallel region spin-wait for threads that are not
running: on the 2-core machine a third of the suite's CPU time went to that (docs/testing.md). A test or
process that wants more threads sets them itself (the engine's `num_threads`, a benchmark's `--threads`)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
