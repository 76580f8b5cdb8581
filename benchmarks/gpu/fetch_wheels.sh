#!/usr/bin/env bash
# Download the wheels a bare GPU machine lacks into benchmarks/gpu/wheels/ (ignored by git).
#
# The device machine's Python has torch (CUDA), transformers, accelerate, safetensors, peft,
# pillow and numpy, but not diffusers; it has no network. The engine path (batching/,
# benchmarks/gpu/) needs only diffusers beyond those: celery, redis and flask serve the
# API and the worker, which the suite does not start. diffusers' own requirements that
# transformers does not already bring are pure-Python (importlib_metadata, zipp); the
# pinned versions are the ones this project tests with. Every wheel here is py3-none-any,
# so it installs on whatever CPython the machine has.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
diffusers_version=$("$python" -c 'import importlib.metadata as m; print(m.version("diffusers"))' 2>/dev/null || echo 0.42.1)
mkdir -p "$here/wheels"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$here/wheels" \
    "diffusers==$diffusers_version" "importlib_metadata>=6,<9" "zipp>=3.20,<4" "filelock>=3.12,<4"
ls -1 "$here/wheels"
