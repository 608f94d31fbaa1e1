"""The client install beside the node's: how big and how long, from an empty download cache and from a warm one.

The client is requirements-client.lock (pyproject.toml's dependencies, resolved for Python 3.11 to 3.13, NumPy 2)
on each of Python 3.11, 3.12 and 3.13; the node is requirements.lock (client + `node` extra + `test` extra: what
./scripts/setup.sh installs, the README's two commands) on Python 3.11, the only Python it supports. Each install is
what scripts/setup.sh does, by uv: a new venv, `uv pip sync LOCK`, then the project's wheel with --no-deps (built
once, from a copy of its sources). Per install: its seconds with an empty uv cache (UV_CACHE_DIR a new temporary
folder: every wheel downloaded), then into another new venv with that cache now warm (uv links the files from it);
the seconds to compile the bytecode apart (`python -m compileall -j 0`: what setup.sh's --compile-bytecode and pip
add, the same with either cache); the size of site-packages (du -s) without and with the bytecode; the package count,
the NumPy version, and whether `tbench --help` runs.

Writes benchmarks/results/client_install.json with its provenance (benchmarks/provenance.py).

Usage: .venv/bin/python benchmarks/client_install.py [--only client-3.12,node-3.11]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import REPO, RESULTS, recorded

UV = REPO / ".venv" / "bin" / "uv"
TARGETS = {  # name -> (Python, lock)
    "client-3.11": ("3.11", "requirements-client.lock"),
    "client-3.12": ("3.12", "requirements-client.lock"),
    "client-3.13": ("3.13", "requirements-client.lock"),
    "node-3.11": ("3.11", "requirements.lock"),
}


def interpreter(version: str) -> str | None:
    """A Python X.Y to build a venv with: pythonX.Y on the PATH, else one of pyenv's (whose shim refuses it where a
    .python-version names another), as its real path; None where there is none. tests/test_client_install.py too."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which(f"python{version}"), *sorted(map(str, pyenv.glob(f"{version}.*/bin/python{version}")))]
    for exe in filter(None, candidates):
        try:
            done = subprocess.run(
                [exe, "-c", "import sys; print(sys.executable); print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        lines = done.stdout.split()
        if done.returncode == 0 and lines[1:] == [version]:
            return lines[0]
    return None


def uv(*args: str, cache: Path) -> None:
    env = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_PYTHON_DOWNLOADS": "never"}
    done = subprocess.run([str(UV), *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"uv {' '.join(args)}: {done.stderr.strip()[-2000:]}")


def build_wheel(work: Path) -> Path:
    """The project's wheel, built once from a copy of its sources (not in the tree); test_client_install.py too."""
    src = work / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for package in ("tbench", "tasks", "flows", "model_adapters"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    uv("build", "--wheel", "--no-build-isolation", "--python", sys.executable, "-o", str(work), str(src), cache=work)
    (wheel,) = work.glob("tbench-*.whl")
    return wheel


def lock_sources(lock: str) -> list[str]:
    """Where the node lock's torch (its CPU build, not on PyPI) comes from, as scripts/setup.sh has it."""
    if lock != "requirements.lock":
        return []
    if list(Path("/opt/wheels").glob("torch-*+cpu-*.whl")):
        return ["--find-links", "/opt/wheels"]
    return ["--extra-index-url", "https://download.pytorch.org/whl/cpu", "--index-strategy", "unsafe-best-match"]


def install(python: str, lock: str, wheel: Path, venv: Path, cache: Path) -> float:
    """scripts/setup.sh's install, less its bytecode (timed apart: the same with a cold cache or a warm one)."""
    started = time.monotonic()
    uv("venv", "--quiet", "--python", python, str(venv), cache=cache)
    target = ["--python", str(venv / "bin" / "python")]
    uv("pip", "sync", "--quiet", *target, *lock_sources(lock), str(REPO / lock), cache=cache)
    uv("pip", "install", "--quiet", "--no-deps", *target, str(wheel), cache=cache)
    return round(time.monotonic() - started, 1)


def mib(path: Path) -> float:
    kib = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True).stdout.split()[0]
    return round(int(kib) / 1024, 1)


PROBE = (
    "import importlib.metadata as m, sys, numpy; "
    "print('%d.%d.%d' % sys.version_info[:3], numpy.__version__, len({d.name for d in m.distributions()}))"
)


def measure(name: str, python: str, lock: str, wheel: Path, work: Path) -> dict:
    cache = work / f"cache-{name}"  # empty: every wheel is downloaded
    cold = install(python, lock, wheel, work / f"{name}-cold", cache)
    shutil.rmtree(work / f"{name}-cold")
    venv = work / name
    warm = install(python, lock, wheel, venv, cache)  # the same cache, now warm
    (site,) = venv.glob("lib/python3.*/site-packages")
    bare = mib(site)
    started = time.monotonic()
    subprocess.run([str(venv / "bin" / "python"), "-m", "compileall", "-q", "-j", "0", str(site)], capture_output=True)
    bytecode = round(time.monotonic() - started, 1)
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", PROBE], capture_output=True, text=True)
    help_ = subprocess.run([str(venv / "bin" / "tbench"), "--help"], capture_output=True, text=True)
    version, numpy, packages = probe.stdout.split() if probe.returncode == 0 else ("?", "?", "0")
    result = {
        "python": version,
        "lock": lock,
        "packages": int(packages),  # installed distributions, the project's own included
        "cold_cache_s": cold,
        "warm_cache_s": warm,
        "bytecode_s": bytecode,
        "site_packages_no_bytecode_mib": bare,
        "site_packages_mib": mib(site),  # with the bytecode, as scripts/setup.sh and pip leave it
        "download_cache_mib": mib(cache),
        "numpy": numpy,
        "tbench_help_ok": help_.returncode == 0,
    }
    shutil.rmtree(venv)
    shutil.rmtree(cache, ignore_errors=True)
    print(f"{name}: {result}", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated, of {', '.join(TARGETS)} (all by default)")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(TARGETS)
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        parser.error(f"unknown --only {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    with recorded(RESULTS / "client_install.json", model_sizes=["no model: the client and node installs"]) as record:
        record["method"] = (
            "uv venv + uv pip sync LOCK + uv pip install --no-deps WHEEL, with an empty UV_CACHE_DIR (cold), then "
            "into a new venv from that cache (warm); bytecode: python -m compileall -j 0 site-packages (what "
            "scripts/setup.sh's --compile-bytecode and pip add); sizes: du -s site-packages"
        )
        record["uv"] = subprocess.run([str(UV), "--version"], capture_output=True, text=True).stdout.strip()
        record["installs"] = {}
        with tempfile.TemporaryDirectory(prefix="tbench-client-install-") as tmp:
            work = Path(tmp)
            wheel = build_wheel(work / "wheel")
            for name in names:
                version, lock = TARGETS[name]
                python = interpreter(version)
                if python is None:
                    record["installs"][name] = {"skipped": f"no python{version} on this machine"}
                    continue
                record["installs"][name] = measure(name, python, lock, wheel, work)
                record.save()
        installs = record["installs"]
        node = installs.get("node-3.11", {})
        if node.get("site_packages_mib"):
            record["client_vs_node"] = {
                n: round(r["site_packages_mib"] / node["site_packages_mib"], 3)
                for n, r in installs.items()
                if n.startswith("client") and r.get("site_packages_mib")
            }
    return 0 if all(r.get("tbench_help_ok", True) for r in record["installs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
