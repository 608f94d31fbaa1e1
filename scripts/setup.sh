#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtual environment with the project and its pinned dependencies,
# and a migrated Prefect database (so the first run does not pay for it). Re-running it is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required (the embedded Triton stubs and the pins)"'

# The exact versions of requirements.lock (scripts/lock.sh re-resolves it), installed by uv: the same set on every
# machine, in seconds rather than pip's minutes.
UV_VERSION=0.13.8
stamp=.venv/.tbench-installed
if [[ ! -f $stamp || requirements.lock -nt $stamp || pyproject.toml -nt $stamp ]]; then
  [[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
  [[ "$(.venv/bin/uv --version 2>/dev/null)" == "uv $UV_VERSION"* ]] \
    || .venv/bin/python -m pip install -qq "uv==$UV_VERSION"
  uv=(.venv/bin/uv pip --quiet)
  # torch is locked to its CPU build (2.13.0+cpu; the PyPI build pulls several GB of CUDA packages), which is not on
  # PyPI: this workplace keeps it in /opt/wheels, elsewhere it comes from PyTorch's CPU index.
  find_links=()
  if compgen -G "/opt/wheels/torch-*+cpu-*.whl" >/dev/null; then find_links=(--find-links /opt/wheels)
  else
    torch=$(grep -E '^torch==' requirements.lock | cut -d' ' -f1)
    "${uv[@]}" install --python .venv/bin/python --index-url https://download.pytorch.org/whl/cpu --no-deps "$torch"
  fi
  # --compile-bytecode: uv installs no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (CI, containers)
  # every process would then compile each module it imports, ~3 s per `tbench` command or flow run
  "${uv[@]}" sync --python .venv/bin/python --compile-bytecode "${find_links[@]}" requirements.lock
  "${uv[@]}" install --python .venv/bin/python --no-deps -e .
  "${uv[@]}" check --python .venv/bin/python
  touch "$stamp"
fi
# The project's own modules too (an editable install: uv compiles none of them); every run, as the sources change.
# Where PYTHONDONTWRITEBYTECODE is set, each process would compile the ones it imports: 0.4 s of CPU per `tbench`
# command, flow run or `prefect deploy` (2.7 s -> 2.3 s to import the CLI and the benchmark flow, measured here).
.venv/bin/python -m compileall -q -j 0 tbench flows tasks >/dev/null

# Prefect's ephemeral API migrates its database on first use (~30 s): do it now.
.venv/bin/python - <<'PY'
from tbench.core.settings import configure_prefect_env
configure_prefect_env()
import asyncio
from prefect.server.database import provide_database_interface
asyncio.run(provide_database_interface().create_db())
PY
