#!/usr/bin/env bash
# The test suite: set up, then unit tests and end-to-end tests (real tritonserver, real perf_analyzer, real Prefect).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
