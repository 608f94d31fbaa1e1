#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): the GPU paths the issue lists, each a case with its status, recorded in
# benchmarks/results/gpu_check.json; its options: --plan, --only, --dry-run, --output, --timeout-s.
#   scripts/gpu_check.sh                      # where tbench's dependencies are installed (.venv, the worker image)
#   scripts/gpu_check.sh --kit gpu_kit        # on a bare GPU node, from the offline kit (scripts/gpu_kit.sh)
# With --kit DIR: the kit's parts found in DIR (checked against DIR/manifest.json) are unpacked and installed under
# /tmp/tbench-gpu-kit (TBENCH_GPU_KIT_HOME): a venv on top of the node's python3 (its torch, onnxruntime, numpy),
# the trimmed tritonserver and perf_analyzer in it. A part installed by an earlier call is not needed again, so the
# kit can arrive in two transfers: the first call installs part 1 and stops (exit 0, saying what is still to come),
# the second installs part 2 and runs the check (docs/how-to/gpu-check.md).
# In the worker image, from a git checkout mounted into it (the record names the checkout's commit):
#   docker run --rm --gpus all --shm-size 8g -v "$PWD":/src -w /src -e PYTHON=/opt/tbench/.venv/bin/python \
#     tbench-worker:24.10 scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
if [[ ${1:-} == --kit ]]; then
  [[ $# -ge 2 ]] || { echo "usage: scripts/gpu_check.sh --kit DIR [gpu_check.py options]" >&2; exit 2; }
  kit=$2
  shift 2
  home=${TBENCH_GPU_KIT_HOME:-/tmp/tbench-gpu-kit}
  set +e
  "${KIT_PYTHON:-python3}" - "$kit" "$home" "$PWD" <<'PY'
"""Unpack and install the kit's parts that are here; write $home/env.sh, the environment the check runs in."""

import glob
import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

started = time.monotonic()
kit, home, repo = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def say(msg: str) -> None:
    print(f"gpu_check: {msg}", flush=True)


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


source = kit / "manifest.json" if (kit / "manifest.json").is_file() else home / "manifest.json"
if not source.is_file():
    sys.exit(f"gpu_check: no kit manifest in {kit} (nor in {home}): carry gpu_kit/manifest.json (scripts/gpu_kit.sh)")
manifest = json.loads(source.read_text())
if manifest.get("kit_format") != 2:
    sys.exit(f"gpu_check: {source}: a kit format this script does not know ({manifest.get('kit_format')})")
if PY != manifest["python"]:
    sys.exit(f"gpu_check: the kit is for Python {manifest['python']}; python3 here is {PY} (KIT_PYTHON=...)")
previous = home / "manifest.json"
if previous.is_file() and json.loads(previous.read_text()).get("fingerprint") != manifest["fingerprint"]:
    say(f"another kit was installed in {home}: starting afresh")
    shutil.rmtree(home)
home.mkdir(parents=True, exist_ok=True)
if source != previous:
    shutil.copy2(source, previous)

venv = home / "venv"
vpython = venv / "bin" / "python"
purelib = venv / "lib" / f"python{PY}" / "site-packages"
if not vpython.exists():
    say(f"creating {venv} on top of {sys.executable}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    # python3 may itself be a venv (its packages are not the base's system site): its site-packages come after ours
    node_sites = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    (purelib / "_tbench_node_site.pth").write_text(f"import site; [site.addsitedir(p) for p in {node_sites!r}]\n")
(purelib / "_tbench_checkout.pth").write_text(f"{repo}\n")  # this checkout's tbench, tasks, flows, model_adapters
tbench = venv / "bin" / "tbench"
tbench.write_text(f"#!{vpython}\nfrom tbench.cli import main\nmain()\n")
tbench.chmod(0o755)

missing = []
earlier = json.loads((home / "setup.json").read_text()) if (home / "setup.json").is_file() else {}
installs = earlier.get("install_s", {})  # each part's unpacking and install, in whichever call it came
for part in manifest["parts"]:
    stamp = home / f"installed-{part['folder']}"
    if stamp.is_file() and stamp.read_text().strip() == part["sha256"]:
        say(f"part {part['transfer']} ({part['folder']}) installed by an earlier call")
        continue
    path = kit / part["name"]
    if not path.is_file():
        missing.append(part)
        continue
    if path.stat().st_size != part["size"] or sha256(path) != part["sha256"]:
        sys.exit(f"gpu_check: {path}: size or sha256 differs from the manifest's: carry it again")
    t0 = time.monotonic()
    target = home / part["folder"]
    shutil.rmtree(target, ignore_errors=True)
    with tarfile.open(path, "r|xz") as tar:
        tar.extractall(home, filter="data")
    pip = sorted(glob.glob(str(target / "pip" / "pip-*.whl")))[-1]
    wheels = sorted(str(w) for w in (target / "wheels").glob("*.whl"))
    pip_install = [str(vpython), f"{pip}/pip", "install", "--no-index", "--no-deps", "--quiet"]
    pip_install.append("--disable-pip-version-check")
    done = subprocess.run([*pip_install, "--no-warn-script-location", *wheels], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"gpu_check: installing part {part['transfer']} failed: {(done.stdout + done.stderr)[-1500:]}")
    for wheel in (target / "stub-numpy").glob("*.whl"):  # numpy 1 for the python backend's stub (see below)
        shutil.rmtree(home / "stub-site", ignore_errors=True)
        subprocess.run([*pip_install, "--target", str(home / "stub-site"), str(wheel)], check=True)
    shutil.rmtree(target / "wheels")
    shutil.rmtree(target / "stub-numpy", ignore_errors=True)
    stamp.write_text(part["sha256"] + "\n")
    installs[part["name"]] = round(time.monotonic() - t0, 1)
    say(f"part {part['transfer']} ({part['folder']}): {len(wheels)} wheels installed in {installs[part['name']]} s")

# Triton 2.51's python backend stub cannot build output tensors from numpy 2 arrays (its pybind11 reads numpy 1's dtype
# layout: every output arrives empty), so with numpy 2 on the node the stub's interpreter, and only it, imports the
# kit's numpy 1.26 (the runtimes it loads, torch and onnxruntime, declare numpy>=1.21); tbench's processes keep numpy 2.
shim = purelib / "_tbench_stub_numpy.pth"
shim.unlink(missing_ok=True)
numpy = subprocess.run([str(vpython), "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True)
numpy2 = numpy.returncode == 0 and int(numpy.stdout.split(".")[0]) >= 2
wanted = os.environ.get("TBENCH_GPU_KIT_STUB_NUMPY", "kit") != "node"  # node: the stub imports the node's numpy
if numpy2 and wanted and (home / "stub-site" / "numpy").is_dir():
    shim.write_text(
        'import os, sys; os.path.basename(os.path.realpath("/proc/self/exe")) == "triton_python_backend_stub"'
        f" and sys.path.insert(0, {str(home / 'stub-site')!r})\n"
    )
    say(f"numpy {numpy.stdout.strip()} here: the python backend's stub gets the kit's numpy 1.26")

# Libraries the node may lack: a shared libpython for the python backend's stub, OpenSSL 3 for perf_analyzer
compat = home / "compat-lib"
shutil.rmtree(compat, ignore_errors=True)
compat.mkdir()
found = [p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig", shutil.which("ldconfig")) if p and os.path.exists(p)]
listed = subprocess.run([found[0], "-p"], capture_output=True, text=True).stdout if found else ""
libdir = Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent")
links = {}
if not (libdir / f"libpython{PY}.so.1.0").exists() and f"libpython{PY}.so.1.0 " not in listed:
    links[f"libpython{PY}.so.1.0"] = next(iter(sorted(home.glob(f"*/compat/libpython{PY}.so.1.0"))), home / "-")
libs = purelib / "nvidia_pytriton.libs"
for soname, pattern in (("libssl.so.3", "libssl-*.so.3"), ("libcrypto.so.3", "libcrypto-*.so.3")):
    if f"{soname} " not in listed:
        links[soname] = next(iter(sorted(libs.glob(pattern))), libs / pattern)
for soname, target in links.items():
    if target.exists():
        (compat / soname).symlink_to(target)
        say(f"{soname}: not on this node, the kit's {target.name}")

env = {
    "PYTHON": str(vpython),
    "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
    "TBENCH_GPU_KIT_HOME": str(home),
}
if any(compat.iterdir()):
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(compat), os.environ.get("LD_LIBRARY_PATH", "")]))
(home / "env.sh").write_text("".join(f"export {k}='{v}'\n" for k, v in env.items()))
setup = {
    "setup_s": round(time.monotonic() - started, 1),  # this call's
    "install_s": installs,
    "python": sys.executable,
    "compat": sorted(links),
    "stub_numpy": shim.is_file(),
}
(home / "setup.json").write_text(json.dumps(setup, indent=1) + "\n")
if missing:
    for part in missing:
        say(
            f"part {part['transfer']} ({part['name']}) is still to come: carry {kit}/manifest.json and "
            f"{kit}/{part['name']} in the next call, made at once (this call's install stays in {home})"
        )
    sys.exit(10)
say(f"kit ready in {home} ({setup['setup_s']} s)")
PY
  rc=$?
  set -e
  [[ $rc -eq 10 ]] && exit 0  # a part is still to come: the next transfer brings it
  [[ $rc -eq 0 ]] || exit $rc
  # shellcheck disable=SC1091
  source "$home/env.sh"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's tbench, whatever the environment installed
exec "$PYTHON" benchmarks/gpu_check.py "$@"
