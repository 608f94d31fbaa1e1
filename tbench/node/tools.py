"""Where the real binaries live and the environment they need (see the platform notes)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from tbench.core.errors import PerfAnalyzerError, ServerStartError


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def pytriton_server_dir() -> Path:
    root = _package_dir("pytriton")
    server = root / "tritonserver" if root else None
    if server is None or not (server / "bin" / "tritonserver").exists():
        raise ServerStartError(
            "embedded tritonserver not found: install the nvidia-pytriton==0.7.0 wheel (it bundles the server)"
        )
    return server


def pytriton_libs_dir() -> Path:
    return pytriton_server_dir().parents[1] / "nvidia_pytriton.libs"


def perf_analyzer_binary() -> Path:
    found = Path(sys.prefix) / "bin" / "perf_analyzer"
    if not found.exists():
        which = shutil.which("perf_analyzer")
        if not which:
            raise PerfAnalyzerError(
                "perf_analyzer not found: install tritonclient[all]==2.51.0 (its wheel ships the binary)"
            )
        found = Path(which)
    return found


def library_path(*dirs: Path) -> str:
    parts = [str(d) for d in dirs] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    return ":".join(parts)


def python_libdir() -> Path:
    # first on LD_LIBRARY_PATH, or the stub picks up a system libpython of another patch version
    return Path(sysconfig.get_config_var("LIBDIR"))


def perf_analyzer_env() -> dict[str, str]:
    """perf_analyzer 2.51 links libb64.so.0d and libcudart.so.12: point those names at pytriton's bundled copies."""
    libs = pytriton_libs_dir()
    link_dir = Path(tempfile.gettempdir()) / f"tbench-perf-libs-{os.getuid()}"
    link_dir.mkdir(parents=True, exist_ok=True)
    for soname, pattern in (("libb64.so.0d", "libb64-*.so.0d"), ("libcudart.so.12", "libcudart-*.so.12*")):
        target = next(iter(sorted(libs.glob(pattern))), None)
        link = link_dir / soname
        if target is not None and not link.exists():
            tmp = link.with_suffix(f".{os.getpid()}")
            tmp.symlink_to(target)
            tmp.replace(link)  # atomic: two runs may race here
    return {**os.environ, "LD_LIBRARY_PATH": library_path(link_dir)}
