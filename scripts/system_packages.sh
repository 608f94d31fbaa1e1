#!/usr/bin/env bash
# The system packages only the tests need (./scripts/test.sh runs this; the main job does not need them).
set -euo pipefail

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

