#!/usr/bin/env bash
# Re-resolves requirements.lock, the exact versions both README commands install (scripts/setup.sh), from the ranges in
# pyproject.toml. Run it after changing a dependency there, or with --upgrade to move every package to its newest
# allowed release; then run ./scripts/test.sh and commit both files together. Extra arguments go to `uv pip compile`,
# e.g. --upgrade-package pandas.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/uv ]] || ./scripts/setup.sh  # the venv with uv in it
find_links=()
[[ -d /opt/wheels ]] && find_links=(--find-links /opt/wheels)  # where this workplace keeps torch's CPU build
# The lock is for Linux x86_64 and Python 3.11 (the embedded Triton stubs and the CPU build of torch are too).
exec .venv/bin/uv pip compile pyproject.toml --extra test --python-version 3.11 \
  --python-platform x86_64-manylinux_2_36 "${find_links[@]}" --no-header --annotation-style line \
  -o requirements.lock "$@"
