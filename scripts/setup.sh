#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtual environment with the project and its pinned dependencies,
# and a migrated Prefect database (so the first run does not pay for it). Re-running it is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required (the embedded Triton stubs and the pins)"'

# Debian's Chromium and ChromeDriver for the browser test of the Prefect UI (tests/test_stack_e2e.py); without root
# they are left out and that one test is skipped, saying why.
if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]] && command -v apt-get >/dev/null; then
  if [[ $(id -u) == 0 ]]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=skip; fi
  if [[ $SUDO != skip ]]; then
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1 \
      || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
             --no-install-recommends chromium chromium-driver >/dev/null 2>&1; } \
      || echo "setup: could not install chromium (the browser test will be skipped)" >&2
  fi
fi

stamp=.venv/.tbench-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  [[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  # torch==2.13.0 is pinned: an unpinned torch would pull several GB of CUDA packages on a CPU machine
  .venv/bin/python -m pip install --quiet -e ".[test]"
  .venv/bin/python -m pip check >/dev/null || .venv/bin/python -m pip check
  touch "$stamp"
fi

# Prefect's ephemeral API migrates its database on first use (~30 s): do it now.
.venv/bin/python - <<'PY'
from tbench.settings import configure_prefect_env
configure_prefect_env()
import asyncio
from prefect.server.database import provide_database_interface
asyncio.run(provide_database_interface().create_db())
PY
