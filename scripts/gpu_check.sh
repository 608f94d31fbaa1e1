#!/usr/bin/env bash
# Every GPU path once on this node, continuing past failures: each format at FP32/FP16 (INT8 where it applies), each
# seed's gpu profile on a reduced grid, each server mode; `tbench doctor --json` decides what is skipped and why.
# Writes benchmarks/results/gpu_check.json (benchmarks/gpu_check.py; its options: --plan, --only, --dry-run).
#   scripts/gpu_check.sh                      # every case
#   scripts/gpu_check.sh --only trt           # the TensorRT cases
# In the worker image, from a git checkout mounted into it (the record names the checkout's commit):
#   docker run --rm --gpus all --shm-size 8g -v "$PWD":/src -w /src -e PYTHON=/opt/tbench/.venv/bin/python \
#     tbench-worker:24.10 scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's tbench, whatever the environment installed
exec "$PYTHON" benchmarks/gpu_check.py "$@"
