#!/usr/bin/env bash
# The test suite: set up, lint and format checks (ruff) and the import layers (import-linter; both set in
# pyproject.toml), then unit tests and end-to-end
# tests (real tritonserver, real perf_analyzer, real Prefect).
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's packages for the docker, PostgreSQL and browser tests install beside the Python set-up, not after it
./scripts/system_packages.sh & system_packages=$!
./scripts/setup.sh
wait "$system_packages"
hint="run .venv/bin/ruff format . && .venv/bin/ruff check --fix . (then fix what remains by hand)"
.venv/bin/ruff check . || { echo "test.sh: ruff check failed; $hint" >&2; exit 1; }
.venv/bin/ruff format --check . || { echo "test.sh: ruff format --check failed; $hint" >&2; exit 1; }
.venv/bin/lint-imports --no-cache || {
  echo "test.sh: an import goes against the layers in pyproject.toml [tool.importlinter]" >&2
  exit 1
}
# Bytecode is written (where the machine's environment says not to): otherwise each test process rewrites and compiles
# every test module again at collection (9.8 s of CPU instead of 6.3 s per worker, measured here)
unset PYTHONDONTWRITEBYTECODE
# One worker per CPU, each pinned to its own, and one more that shares them (tests/conftest.py): a third of the
# suite's time is spent waiting (Prefect's scheduler, a worker's polling, a server's start), so on 2 cores a third
# worker keeps both busy. conftest.py sends each module to one worker, slowest first.
exec .venv/bin/python -m pytest -n "${TBENCH_TEST_WORKERS:-$(($(nproc) + 1))}" "$@"
