#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtual environment with the project and its pinned dependencies,
# and a migrated Prefect database (so the first run does not pay for it). Re-running it is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required (the embedded Triton stubs and the pins)"'

# System packages some end-to-end tests need, from Debian's packages: Chromium and ChromeDriver (the Prefect UI's
# browser test), docker.io (docker mode and the docker pool; the tests start dockerd themselves) and PostgreSQL (the
# stack on PostgreSQL; the test starts a throwaway cluster). Without root they are left out and those tests are
# skipped, saying why. TBENCH_SKIP_SYSTEM_PACKAGES=1 leaves them out on purpose.
apt_install() {  # apt_install WHAT PACKAGE...: installs what is missing, once; never fails the set-up
  local what=$1; shift
  local SUDO
  if [[ $(id -u) == 0 ]]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "setup: not root: $what not installed (its tests will be skipped)" >&2; return 0; fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
           --no-install-recommends "$@" >/dev/null 2>&1; } \
    || echo "setup: could not install $what (its tests will be skipped)" >&2
}
if [[ ${TBENCH_SKIP_SYSTEM_PACKAGES:-0} != 1 ]] && command -v apt-get >/dev/null; then
  [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]] || apt_install chromium chromium chromium-driver
  command -v dockerd >/dev/null || apt_install docker.io docker.io
  { command -v initdb >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; } \
    || apt_install postgresql postgresql
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
from tbench.core.settings import configure_prefect_env
configure_prefect_env()
import asyncio
from prefect.server.database import provide_database_interface
asyncio.run(provide_database_interface().create_db())
PY
