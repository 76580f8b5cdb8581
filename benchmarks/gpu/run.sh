#!/usr/bin/env bash
# The prepared GPU run: installs the carried wheels if diffusers is missing, then runs the suite.
#
#   benchmarks/gpu/fetch_wheels.sh        # here, with network: fills benchmarks/gpu/wheels/
#   benchmarks/gpu/run.sh [OUT_DIR]       # on the GPU machine, from anywhere; default $OUT, else benchmarks/results/gpu
#   benchmarks/gpu/run.sh --dry-run DIR   # tiny sizes on the CPU (what `make test` runs)
#
# It runs `stepwise bench --suite gpu` (from this tree, without installing the project: the machine
# lacks the service's dependencies, which the suite does not need).
#
# The wheels folder is ignored by git: a device run that copies the work tree must carry it
# (the project's device tool: command `benchmarks/gpu/run.sh "$OUT"`, carry `benchmarks/gpu/wheels`).
# Fits in 8 minutes on one H200 (the suite stops starting sections after --budget-seconds, 420 by default).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-python3}
args=()
if [[ "${1:-}" == "--dry-run" ]]; then args+=(--dry-run); shift; fi
out=${1:-${OUT:-$root/benchmarks/results/gpu}}
# find_spec, not an import: importing diffusers costs seconds, and the suite imports it anyway.
if ! "$python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("diffusers") is None)'; then
    # With its dependencies where the machine's satisfy them; otherwise diffusers and its pure-Python helpers alone
    # (transformers already brings huggingface_hub, requests, regex, safetensors).
    "$python" -m pip install --quiet --no-index --find-links "$here/wheels" diffusers ||
        "$python" -m pip install --quiet --no-index --no-deps --find-links "$here/wheels" \
            diffusers importlib_metadata zipp
fi
cd "$root"
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m stepwise_cli.main bench --suite gpu "${args[@]}" \
    --out "$out"
