"""A Triton image for `--server docker` built from this machine's files, where no registry is reachable.

It holds the tritonserver of the nvidia-pytriton wheel (python backend only) at NGC's paths (`/opt/tritonserver`,
`tritonserver` on PATH), this Python and the runtimes the python backend's `model.py` serves ONNX with (numpy,
onnxruntime), and every shared library they link: the same layout docker mode expects of NGC's image, CPU only.
The files keep their paths on this machine, so the interpreter, the stub and their libraries find each other as
they do here. The root filesystem is assembled in a temporary folder and imported with `docker import`.

    .venv/bin/python infra/build_cpu_image.py [--tag NAME:TAG] [--force]

The default tag names what the image holds (`tbench-triton-cpu:2.51-<digest of the versions and this script>`), so
an image already built from the same files is reused.

Tests use it to run docker mode for real; a team without access to NGC can use it to try docker mode on a CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

IMAGE = "tbench-triton-cpu"
SITE_PACKAGES = ("numpy", "numpy.libs", "onnxruntime", "pytriton/tritonserver", "nvidia_pytriton.libs")
TOOLS = (
    "bash",
    "sh",
    "env",
    "ls",
    "cat",
)  # the python backend starts its stub through bash; docker mode lists backends
SKIP = ("test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "__pycache__")


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _copy(src: Path, root: Path) -> None:
    """`src` at the same absolute path under `root`, a symlink as a symlink (and what it points to)."""
    dest = root / str(src).lstrip("/")
    if dest.exists() or dest.is_symlink():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_symlink():
        target = os.readlink(src)
        os.symlink(target, dest)
        _copy((src.parent / target).resolve() if not os.path.isabs(target) else Path(target), root)
    elif src.is_dir():
        shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(*SKIP))
    else:
        shutil.copy2(src, dest)


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _linked(path: Path, env: dict[str, str]) -> set[Path]:
    """The shared libraries `path` loads, as ldd resolves them with the image's library path."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, env=env).stdout
    found = set()
    for line in out.splitlines():
        m = re.search(r"=>\s+(/\S+)", line) or re.match(r"\s*(/\S+)\s+\(", line)
        if m:
            found.add(Path(m.group(1)))
    return found


def _library_path(server: Path) -> str:
    return ":".join(
        [
            sysconfig.get_config_var("LIBDIR"),
            str(server.parents[1] / "nvidia_pytriton.libs"),
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
        ]
    )


def assemble(root: Path) -> dict[str, str]:
    """Fill `root` with the image's files; returns the image's environment."""
    site = _site_packages()
    server = site / "pytriton" / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for top in ("bin", "lib", "lib64", "sbin"):  # Debian's merged /usr
        (root / "usr" / top).mkdir(parents=True, exist_ok=True)
        os.symlink(f"usr/{top}", root / top)
    for sub in SITE_PACKAGES:
        _copy(site / sub, root)
    base = Path(sys.base_prefix)
    _copy(base / "lib" / f"python{version}", root)
    for lib in (base / "lib").glob("libpython3*.so*"):
        _copy(lib, root)
    _copy(Path(sys.prefix) / "pyvenv.cfg", root)
    for exe in ("python", "python3", f"python{version}"):
        _copy(Path(sys.prefix) / "bin" / exe, root)
    for tool in TOOLS:
        _copy(Path(shutil.which(tool)), root)
    # NGC's layout: /opt/tritonserver/{bin,backends}, with the python backend's stub for this Python beside it
    copied = root / str(server).lstrip("/")
    shutil.copy2(
        server / "python_backend_stubs" / version / "triton_python_backend_stub",
        copied / "backends" / "python" / "triton_python_backend_stub",
    )
    (root / "opt").mkdir(exist_ok=True)
    os.symlink(str(server), root / "opt" / "tritonserver")
    env = {"PATH": f"/opt/tritonserver/bin:{sys.prefix}/bin:/usr/bin:/bin", "LD_LIBRARY_PATH": _library_path(server)}
    # every ELF file's libraries, found the way the image's loader will find them
    ldd_env = {**os.environ, "LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"]}
    pending = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and _is_elf(p)]
    seen: set[Path] = set()
    while pending:
        for lib in _linked(Path("/") / pending.pop().relative_to(root), ldd_env) - seen:
            seen.add(lib)
            _copy(lib, root)
            pending.append(root / str(lib.resolve()).lstrip("/"))
    for d in ("tmp", "dev/shm", "proc", "sys", "etc"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    return env


def default_tag() -> str:
    versions = [sys.version] + [importlib.metadata.version(p) for p in ("nvidia-pytriton", "onnxruntime", "numpy")]
    digest = hashlib.sha256(("\n".join(versions) + Path(__file__).read_text()).encode()).hexdigest()[:12]
    return f"{IMAGE}:2.51-{digest}"


def image_exists(tag: str, docker: str = "docker") -> bool:
    return subprocess.run([docker, "image", "inspect", tag], capture_output=True).returncode == 0


def build(tag: str | None = None, docker: str = "docker", force: bool = False) -> str:
    tag = tag or default_tag()
    if not force and image_exists(tag, docker):
        return tag
    with tempfile.TemporaryDirectory(prefix="tbench-image-") as tmp:
        root = Path(tmp)
        env = assemble(root)
        changes = [f"--change=ENV {k}={v}" for k, v in env.items()] + ['--change=CMD ["tritonserver"]']
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        done = subprocess.run([docker, "import", *changes, "-", tag], stdin=tar.stdout, capture_output=True, text=True)
        tar.stdout.close()
        tar.wait()
        if done.returncode != 0 or tar.returncode != 0:
            raise SystemExit(f"docker import of {tag} failed: {(done.stderr or done.stdout).strip()}")
    return tag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", help="the image's name:tag (by default one that names its content)")
    parser.add_argument("--docker", default="docker")
    parser.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    args = parser.parse_args()
    print(build(args.tag, args.docker, args.force))


if __name__ == "__main__":
    main()
