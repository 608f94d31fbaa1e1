#!/usr/bin/env bash
# Re-resolves the two locks from the ranges in pyproject.toml. Run it after changing a dependency there, or with
# --upgrade to move every package to its newest allowed release; then run ./scripts/test.sh and commit the three files
# together. Extra arguments go to both `uv pip compile` calls, e.g. --upgrade-package pandas.
#
# - requirements.lock: the exact versions both README commands install (scripts/setup.sh): the client, the node's
#   stack (--extra node) and the tests' tools (--extra test), for Linux x86_64 and Python 3.11 (the embedded Triton
#   stubs and the CPU build of torch are too).
# - requirements-client.lock: the client alone (`tbench submit`, `results`, `compare`, `history`, `upload`, `stack env`
#   on a laptop or in CI), resolved once for every Python pyproject.toml allows (3.11 to 3.13) and every platform
#   (--universal: a package whose versions differ between Pythons gets one line per version, with a marker); without
#   the node's caps, NumPy 2 and the newest pyarrow come in. Install it with
#   `pip install -r requirements-client.lock && pip install --no-deps .` (or uv pip sync, then the same --no-deps).
# Each keeps the versions it already holds unless told to upgrade (uv reads the existing file as its preferences).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/uv ]] || ./scripts/setup.sh  # the venv with uv in it
find_links=()
[[ -d /opt/wheels ]] && find_links=(--find-links /opt/wheels)  # where this workplace keeps torch's CPU build
.venv/bin/uv pip compile pyproject.toml --extra node --extra test --python-version 3.11 \
  --python-platform x86_64-manylinux_2_36 "${find_links[@]}" --no-header --annotation-style line \
  -o requirements.lock "$@"
.venv/bin/uv pip compile pyproject.toml --universal --python-version 3.11 --no-header --annotation-style line \
  -o requirements-client.lock "$@"
