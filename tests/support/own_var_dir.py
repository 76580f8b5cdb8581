"""The tests' own STEPWISE_VAR_DIR, set when tests/conftest.py imports this module (before any other conftest or
test module is imported).

Every stepwise process finds its Redis through `<STEPWISE_VAR_DIR>/stepwise.json` when no URL is set, and refuses
to start when that file names a `stepwise up` that stopped (storage.redis_location); the worker reads its settings
when it is imported. The checkout's var/ is the user's (a `make run` here, running or not): the tests, which name
their own Redis, must not depend on it, so they look in an empty folder of their own."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

VAR_DIR = tempfile.mkdtemp(prefix="stepwise-tests-var-")
os.environ["STEPWISE_VAR_DIR"] = VAR_DIR
atexit.register(shutil.rmtree, VAR_DIR, True)
