#!/usr/bin/env bash
# The offline GPU kit: what a bare, air-gapped GPU node (Python 3.12 with PyTorch, onnxruntime, numpy 2...; no Triton,
# no Prefect, no package registry) needs to run tbench's real flow, built HERE (where pip reaches a registry) into an
# ignored folder of compressed parts, each small enough to travel beside the working tree in one transfer.
#
#   scripts/gpu_kit.sh                 # builds (or finds up to date) gpu_kit/: its parts and manifest.json
#   scripts/gpu_kit.sh --out DIR       # elsewhere;  --force: rebuild even if up to date
#   scripts/gpu_kit.sh --check         # only find it up to date (exit 3 where it is not built: nothing is built)
#
# The parts (xz-compressed tars, each < 56 MiB: a transfer is 64 MiB with the working tree):
#   - nvidia-pytriton 0.7.0's wheel, trimmed: tritonserver 2.51, the python backend, only the Python 3.12 stub and
#     only the bundled libraries those load (their DT_NEEDED closure: libpython3.13 and the other stubs go);
#     tritonclient 2.51.0's wheel with perf_analyzer (its duplicate perf_client goes); numpy 1.26.4 for the python
#     backend's stub alone (the 2.51 stub reads numpy 2's dtypes wrongly: every output tensor comes back empty;
#     gpu_check.sh puts it first on the stub's sys.path only, where the node has numpy 2); a stripped
#     libpython3.12.so.1.0, used only where the node's Python has no shared libpython: all in part 1;
#   - cp312 manylinux x86_64 wheels of what tbench needs that the node lacks: pyproject.toml's dependencies (prefect,
#     pydantic, tritonclient, ruptures and scipy...) and theirs, at requirements.lock's versions where those exist
#     for 3.12, spread over both parts so that they come out of about one size; pip's wheel in each (each part
#     installs on its own).
# Left to the node (never shadowed: its builds match its torch): numpy, protobuf, grpcio, pandas, pyarrow,
# matplotlib, pillow, torch, onnx, onnxruntime; left out: TensorFlow's, the stack's (LEFT_OUT below). Wheels are
# repacked uncompressed, so that xz compresses across their contents.
# On the node, scripts/gpu_check.sh --kit gpu_kit unpacks and installs them (docs/how-to/gpu-check.md).
#
# Downloads, repacked wheels and compressed parts are cached under ~/.cache/tbench/gpu_kit (TBENCH_GPU_KIT_CACHE),
# the finished kit by a fingerprint of this script, pyproject.toml and requirements.lock: with those unchanged a
# rebuild only checks or copies it (under a second, no network); the first build takes 4 to 6 minutes on two cores
# (downloads, then xz, one core per part); after an edit here that leaves the contents as they were, half a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
exec "$PYTHON" - "$0" "$@" <<'PY'
import argparse
import datetime as dt
import hashlib
import json
import lzma
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SCRIPT = Path(sys.argv[1]).resolve()
REPO = SCRIPT.parents[1]
KIT_FORMAT = 2  # bump when the layout the node side reads changes
MiB = 1 << 20
PART_LIMIT = 56 * MiB  # a transfer carries 64 MiB in all, the working tree included
TRANSFERS = 2
PY = "3.12"
PLATFORMS = ["manylinux1", "manylinux2010", "manylinux2014", *(f"manylinux_2_{i}" for i in range(5, 36))]
PIP = "pip==26.3"  # runs the install on the node (its Python may have no ensurepip)
SERVER = ["nvidia-pytriton==0.7.0", "tritonclient==2.51.0"]  # the server part's wheels, trimmed, without deps
# The python backend stub of Triton 2.51 builds its output tensors through a pybind11 that predates numpy 2: with
# numpy 2 it reads a dtype's item size from numpy 1's struct layout and every output comes back with 0 bytes. The
# stub's interpreter alone gets numpy 1 (the node's runtimes declare numpy>=1.21; pandas, which needs 2, is not
# imported there); tbench's own processes keep the node's numpy 2.
STUB_NUMPY = "numpy==1.26.4"
# The node's own: never in the kit, so its builds (against its numpy and CUDA torch) are the ones imported
NODE_HAS = {"numpy", "protobuf", "grpcio", "pandas", "pyarrow", "matplotlib", "pillow", "torch", "onnx", "onnxruntime"}
# The project's dependencies (pyproject.toml) a GPU check on such a node does not import, and why
LEFT_OUT = {
    "tensorflow-cpu": "TensorFlow: the node has none (its paths are not executable there)",
    "tf2onnx": "TensorFlow's exports: the node has no TensorFlow",
    "s3fs": "s3:// artifact roots: the check writes its runs locally",
    "moto": "the local stack's S3 server",
    "prefect-docker": "the docker pools' workers",
    "nvidia-pytriton": "in the server's part, trimmed",
}
# Every other dependency of the project comes in the kit's wheels, with its own dependencies, at requirements.lock's
# versions; tbench/, tasks/, flows/ and model_adapters/ travel with the working tree. tritonclient's http extra pins
# geventhttpclient<=2.0.2, which has no cp312 wheel: the grpc extra, and geventhttpclient 2.6.1 beside it (it serves
# tritonclient.http 2.51: tbench polls readiness with it; seen on Python 3.12 with numpy 2).
EXTRA = ["geventhttpclient==2.6.1"]
NOT_CONSTRAINED = NODE_HAS | {"geventhttpclient", "pip"}
STUB = f"pytriton/tritonserver/python_backend_stubs/{PY}/"


def log(msg: str) -> None:
    print(f"gpu_kit: {msg}", flush=True)


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def python_requirements() -> list[str]:
    """pyproject.toml's dependencies and its node extra, less the node's own and LEFT_OUT: what the node lacks to run
    tbench (a package in both: the node extra's pin)."""
    reqs = {}
    for spec in project_dependencies():
        name = norm(re.split(r"[=<>!~\[ ;]", spec, maxsplit=1)[0])
        if name in NODE_HAS or name in LEFT_OUT:
            continue
        reqs[name] = "tritonclient[grpc]" + spec[spec.index("]") + 1 :] if name == "tritonclient" else spec
    return list(reqs.values()) + EXTRA


def project_dependencies() -> list[str]:
    """The client's dependencies, then the node extra's (tbench[node]): everything a node runs."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + project["optional-dependencies"]["node"]


def fingerprint() -> str:
    h = hashlib.sha256(f"kit-format-{KIT_FORMAT}\n".encode())
    for path in (SCRIPT, REPO / "requirements.lock", REPO / "pyproject.toml"):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


# --- resolving and downloading ---


def pip_target_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", PY, "--implementation", "cp", "--abi", "cp312"]
    for p in PLATFORMS:
        args += ["--platform", f"{p}_x86_64"]
    return args


def resolve(reqs: list[str], constraints: Path | None, no_deps: bool, work: Path) -> list[dict]:
    """pip's own resolution for a cp312 manylinux x86_64 node: [{name, version, url, sha256, filename}]."""
    report = work / f"report-{len(list(work.iterdir()))}.json"
    argv = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report),
        "--target",
        str(work / "never-written"),
        *pip_target_args(),
    ]
    argv += ["--no-deps"] if no_deps else []
    argv += ["-c", str(constraints)] if constraints else []
    done = subprocess.run([*argv, *reqs], capture_output=True, text=True)
    if done.returncode != 0:
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip() and "WARNING" not in ln]
        raise SystemExit("gpu_kit: pip could not resolve the kit's wheels (network?):\n  " + "\n  ".join(lines[-8:]))
    out = []
    for item in json.loads(report.read_text())["install"]:
        info = item["download_info"]
        url = info["url"]
        out.append(
            {
                "name": norm(item["metadata"]["name"]),
                "version": item["metadata"]["version"],
                "url": url,
                "sha256": info.get("archive_info", {}).get("hashes", {}).get("sha256"),
                "filename": url.rsplit("/", 1)[-1].split("#")[0],
            }
        )
    return out


def download(items: list[dict], wheels: Path) -> None:
    missing = [
        i
        for i in items
        if not (wheels / i["filename"]).is_file() or (i["sha256"] and sha256(wheels / i["filename"]) != i["sha256"])
    ]
    if missing:
        log(f"downloading {len(missing)} wheels")
        with tempfile.TemporaryDirectory(dir=wheels) as tmp:
            argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", tmp, *pip_target_args()]
            done = subprocess.run([*argv, *(i["url"] for i in missing)], capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"gpu_kit: download failed: {(done.stdout + done.stderr).strip()[-800:]}")
            for i in missing:
                got = Path(tmp) / i["filename"]
                if i["sha256"] and sha256(got) != i["sha256"]:
                    raise SystemExit(f"gpu_kit: {i['filename']}: sha256 differs from the index's")
                os.replace(got, wheels / i["filename"])


def constraints_file(work: Path) -> Path:
    """requirements.lock without the node's own packages (and pins that have no cp312 wheel)."""
    lines = []
    for line in (REPO / "requirements.lock").read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec and norm(re.split(r"[=<>!~\[ ;]", spec, maxsplit=1)[0]) not in NOT_CONSTRAINED:
            lines.append(spec.split("+", 1)[0] if "+" in spec else spec)  # local versions (torch +cpu) go
    path = work / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


# --- trimming and repacking ---


def elf_needed(data: bytes) -> list[str]:
    """DT_NEEDED of a 64-bit little-endian ELF file (the shared libraries it links), [] for anything else."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for _, kind, _, _, offset, size, link, *_ in sections:
        if kind != 6:  # SHT_DYNAMIC
            continue
        strtab = sections[link][4]
        for pos in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, pos)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                start = strtab + value
                names.append(data[start : data.index(b"\0", start)].decode())
    return names


def pytriton_drop(zin: zipfile.ZipFile) -> tuple[set[str], dict]:
    """The members to leave out of nvidia-pytriton's wheel: the stubs of other Pythons, and every bundled library
    that no kept binary loads (the DT_NEEDED closure of tritonserver, the backends, caches and the 3.12 stub)."""
    libs = {Path(n).name: n for n in zin.namelist() if n.startswith("nvidia_pytriton.libs/") and not n.endswith("/")}
    stubs = [n for n in zin.namelist() if n.startswith("pytriton/tritonserver/python_backend_stubs/")]
    other_stubs = {n for n in stubs if not n.startswith(STUB) and not n.endswith("python_backend_stubs/")}
    roots = [
        n
        for n in zin.namelist()
        if n.startswith("pytriton/")
        and n not in other_stubs
        and not n.endswith("/")
        and zin.getinfo(n).file_size > 64
        and zin.read(n)[:4] == b"\x7fELF"
    ]
    if not any(n.startswith(STUB) for n in roots):
        raise SystemExit(f"gpu_kit: nvidia-pytriton has no Python {PY} stub")
    keep, todo = set(), [n for r in roots for n in elf_needed(zin.read(r))]
    while todo:
        name = todo.pop()
        if name in libs and name not in keep:
            keep.add(name)
            todo += elf_needed(zin.read(libs[name]))
    dropped_libs = sorted(set(libs) - keep)
    info = {
        "roots": sorted(roots),
        "libraries_kept": sorted(keep),
        "libraries_dropped": dropped_libs,
        "stubs_dropped": sorted({n.split("/")[3] for n in other_stubs}),
    }
    return {libs[n] for n in dropped_libs} | other_stubs, info


def repack(src: Path, dst: Path, drop: set[str] = frozenset()) -> None:
    """The wheel with every member stored uncompressed (xz then compresses across files), less `drop`; RECORD keeps
    the lines of the members kept (hashes are of contents, unchanged by the repacking)."""
    tmp = dst.with_name(dst.name + ".tmp")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if info.filename in drop:
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD") and drop:
                kept = [ln for ln in data.decode().splitlines() if ln.split(",", 1)[0] not in drop]
                data = ("\n".join(kept) + "\n").encode()
            info.compress_type = zipfile.ZIP_STORED
            zout.writestr(info, data)
    os.replace(tmp, dst)


def stored(item: dict, wheels: Path, cache: Path, trim: str = "") -> tuple[Path, dict, int]:
    """The repacked (and for the server's wheels, trimmed) copy of a downloaded wheel, cached by its source; what was
    trimmed; and its members' deflated size, which stands for its compressed size when the parts are balanced."""
    src = wheels / item["filename"]
    key = hashlib.sha256(f"{item['sha256'] or sha256(src)} {trim} {KIT_FORMAT} meta2".encode()).hexdigest()[:16]
    dst = cache / "stored" / key / item["filename"]
    meta = dst.with_name("meta.json")
    if dst.is_file() and meta.is_file():
        kept = json.loads(meta.read_text())
        return dst, kept["trim"], kept["deflated"]
    dst.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(src) as zin:
        if trim == "pytriton":
            drop, info = pytriton_drop(zin)
        elif trim == "tritonclient":  # perf_client is the same binary as perf_analyzer, 20 MB again
            drop = {n for n in zin.namelist() if n.endswith("/bin/perf_client")}
            info = {"dropped": sorted(drop)}
        else:
            drop, info = set(), {}
        deflated = sum(i.compress_size for i in zin.infolist() if i.filename not in drop)
    repack(src, dst, drop)
    meta.write_text(json.dumps({"trim": info, "deflated": deflated}, indent=1))
    return dst, info, deflated


def shared_libpython() -> Path | None:
    """A shared libpython3.12 on this machine (python3.12 on PATH, pyenv's), for nodes whose Python has none."""
    candidates = []
    for exe in filter(None, [shutil.which(f"python{PY}")]):
        out = subprocess.run(
            [exe, "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"], capture_output=True, text=True
        )
        candidates.append(Path(out.stdout.strip()) / f"libpython{PY}.so.1.0")
    pyenv = shutil.which("pyenv")  # its root, wherever HOME is (a user's ~/.pyenv, or PYENV_ROOT)
    roots = [os.environ.get("PYENV_ROOT"), str(Path.home() / ".pyenv")]
    if pyenv:
        roots.append(subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip())
    for root in dict.fromkeys(filter(None, roots)):
        candidates += sorted(Path(root).glob(f"versions/{PY}.*/lib/libpython{PY}.so.1.0"), reverse=True)
    return next((c for c in candidates if c.is_file()), None)


# --- parts ---


def write_part(path: Path, top: str, files: list[tuple[str, Path, int]]) -> None:
    """A deterministic tar (sorted, no times or owners) of `files` under `top/`, xz-compressed at preset 9, the x86
    filter first where it holds the server's binaries."""
    filters = [{"id": lzma.FILTER_LZMA2, "preset": 9}]
    if any(arc.startswith("wheels/nvidia_pytriton-") for arc, _, _ in files):
        filters.insert(0, {"id": lzma.FILTER_X86})
    tmp = path.with_name(path.name + ".tmp")
    with (
        lzma.open(tmp, "wb", format=lzma.FORMAT_XZ, filters=filters) as xz,
        tarfile.open(fileobj=xz, mode="w|", format=tarfile.PAX_FORMAT) as tar,
    ):
        dirs = sorted({str(Path(top, arc).parent) for arc, _, _ in files} | {top})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for arc, src, mode in sorted(files):
            info = tarfile.TarInfo(f"{top}/{arc}")
            info.size, info.mode, info.mtime = src.stat().st_size, mode, 0
            with open(src, "rb") as f:
                tar.addfile(info, f)
    os.replace(tmp, path)


def balanced(fixed: list[list], wheels: list[tuple[str, Path, int, int]]) -> list[list]:
    """The wheels spread over the parts (each starting with its `fixed` files), the largest first, each to the part
    whose estimated compressed size is smallest so far: the parts come out of about one size."""
    parts = [list(f) for f in fixed]
    for wheel in sorted(wheels, key=lambda w: (-w[3], w[0])):
        min(parts, key=lambda part: sum(f[3] for f in part)).append(wheel)
    return parts


def cached_part(path: Path, top: str, files: list[tuple[str, Path, int]], cache: Path) -> None:
    """write_part, or its copy from an earlier build of the same contents (the files are cache entries: their path,
    size and time name their contents)."""
    what = [
        KIT_FORMAT,
        top,
        sorted((arc, str(src), src.stat().st_size, src.stat().st_mtime_ns, mode) for arc, src, mode in files),
    ]
    key = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]
    kept = cache / "parts" / f"{key}-{path.name}"
    if not kept.is_file():
        kept.parent.mkdir(parents=True, exist_ok=True)
        for old in kept.parent.glob(f"*-{path.name}"):
            old.unlink()
        write_part(kept, top, files)
    shutil.copy2(kept, path)


def build(out_dir: Path, cache: Path, fp: str) -> dict:
    started = time.monotonic()
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-kit-") as tmp:
        work = Path(tmp)
        constraints = constraints_file(work)
        log("resolving the wheels for Python 3.12, manylinux x86_64")
        server = resolve(SERVER, None, True, work)
        pip = resolve([PIP], None, True, work)
        stub_numpy = resolve([STUB_NUMPY], None, True, work)
        python = [i for i in resolve(python_requirements(), constraints, False, work) if i["name"] not in NODE_HAS]
        python = [i for i in python if i["name"] not in {"tritonclient", "nvidia-pytriton"}]  # the server part's
        download(server + pip + stub_numpy + python, wheels)
    log("repacking (and trimming the server's) wheels")
    trims = {}
    server_files = []  # (name in the part, file, mode, estimated compressed size)
    for item in server:
        trim = {"nvidia-pytriton": "pytriton", "tritonclient": "tritonclient"}[item["name"]]
        path, trims[item["name"]], deflated = stored(item, wheels, cache, trim)
        server_files.append((f"wheels/{path.name}", path, 0o644, deflated))
    pip_path, _, pip_size = stored(pip[0], wheels, cache)
    numpy_path, _, numpy_size = stored(stub_numpy[0], wheels, cache)
    server_files.append((f"stub-numpy/{numpy_path.name}", numpy_path, 0o644, numpy_size))
    python_files = []
    for item in python:
        path, _, deflated = stored(item, wheels, cache)
        python_files.append((f"wheels/{path.name}", path, 0o644, deflated))
    compat = {}
    if libpython := shared_libpython():
        stripped = cache / "compat" / f"libpython{PY}.so.1.0"
        stripped.parent.mkdir(parents=True, exist_ok=True)
        if not stripped.is_file() or stripped.stat().st_mtime < libpython.stat().st_mtime:
            shutil.copy2(libpython, stripped)
            if shutil.which("strip"):
                subprocess.run(["strip", "--strip-unneeded", str(stripped)], check=True)
        server_files.append((f"compat/{stripped.name}", stripped, 0o755, stripped.stat().st_size // 4))
        version = libpython.parents[1].name if ".pyenv" in str(libpython) else str(libpython)
        compat[stripped.name] = f"{version}: used only where the node's Python has no shared libpython{PY}"
    else:
        log(f"no shared libpython{PY} here: the kit will rely on the node's")
    # part 1: the server, perf_analyzer and some of the wheels; part 2: the other wheels; each with pip, so that
    # each installs on its own, in either order
    pip_file = (f"pip/{pip_path.name}", pip_path, 0o644, pip_size)
    contents = balanced([[*server_files, pip_file], [pip_file]], python_files)
    parts = [(f"tbench-gpu-kit-{n}.tar.xz", f"part{n}", [f[:3] for f in files]) for n, files in enumerate(contents, 1)]
    staging = cache / "out" / f"{fp}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    log("compressing the parts (xz -9: a few minutes, unless their contents are cached)")
    with ThreadPoolExecutor(len(parts)) as pool:  # lzma releases the GIL: one core per part
        list(pool.map(lambda p: cached_part(staging / p[0], p[1], p[2], cache), parts))
    manifest = {
        "kit": "tbench-gpu-kit",
        "kit_format": KIT_FORMAT,
        "fingerprint": fp,
        "built": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "built_on": f"{os.uname().nodename}, Python {sys.version.split()[0]}",
        "build_s": None,
        "python": PY,
        "platform": "manylinux x86_64 (nvidia-pytriton needs glibc >= 2.35)",
        "part_limit_bytes": PART_LIMIT,
        "transfers": TRANSFERS,
        "parts": [],
        "node_provides": sorted(NODE_HAS),
        "left_out": LEFT_OUT,
        "wheels": {i["name"]: i["version"] for i in server + pip + python},
        "stub_numpy": stub_numpy[0]["version"],
        "trimmed": trims,
        "compat": compat,
    }
    for transfer, (name, top, files) in enumerate(parts, 1):
        path = staging / name
        manifest["parts"].append(
            {
                "name": name,
                "folder": top,
                "transfer": transfer,
                "size": path.stat().st_size,
                "sha256": sha256(path),
                "unpacked_bytes": sum(src.stat().st_size for _, src, _ in files),
                "holds": sorted(arc for arc, _, _ in files),
            }
        )
    manifest["total_bytes"] = sum(p["size"] for p in manifest["parts"])
    manifest["build_s"] = round(time.monotonic() - started, 1)
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    final = cache / "out" / fp
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    for old in (cache / "out").iterdir():  # earlier builds' parts: only the current ones are kept
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return manifest


def verified(folder: Path) -> dict | None:
    """The manifest of a complete kit in `folder` (every part there, size and sha256 as recorded), else None."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    for part in manifest.get("parts", []):
        path = folder / part["name"]
        if not path.is_file() or path.stat().st_size != part["size"] or sha256(path) != part["sha256"]:
            return None
    return manifest


def check_limits(manifest: dict) -> None:
    too_big = [f"{p['name']} ({p['size'] / MiB:.1f} MiB)" for p in manifest["parts"] if p["size"] >= PART_LIMIT]
    if too_big:
        raise SystemExit(f"gpu_kit: parts over {PART_LIMIT // MiB} MiB: {', '.join(too_big)}")
    if len(manifest["parts"]) > manifest["transfers"]:
        raise SystemExit(f"gpu_kit: {len(manifest['parts'])} parts for {manifest['transfers']} transfers")


def main() -> None:
    parser = argparse.ArgumentParser(prog="scripts/gpu_kit.sh", description="Build the offline GPU kit.")
    parser.add_argument("--out", default="gpu_kit", help="where the parts go (default: gpu_kit/, git-ignored)")
    parser.add_argument(
        "--cache",
        default=os.environ.get("TBENCH_GPU_KIT_CACHE", "~/.cache/tbench/gpu_kit"),
        help="downloads, repacked wheels and parts (default: ~/.cache/tbench/gpu_kit)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild the parts even if up to date")
    parser.add_argument(
        "--check",
        action="store_true",
        help="only find the kit up to date (in --out or the cache) and say so; exit 3, building nothing, where it is not",
    )
    args = parser.parse_args(sys.argv[2:])
    out_dir = (REPO / os.path.expanduser(args.out)).resolve()
    cache = Path(os.path.expanduser(args.cache)).resolve()
    fp = fingerprint()
    current = verified(out_dir)
    if current and current.get("fingerprint") == fp and not args.force:
        log(f"{out_dir} is up to date ({fp})")
        manifest = current
    else:
        manifest = None if args.force else verified(cache / "out" / fp)
        if manifest is None and args.check:
            log(f"no kit built for {fp} (in {out_dir} or {cache / 'out'}): scripts/gpu_kit.sh builds it")
            raise SystemExit(3)
        if manifest is None:
            manifest = build(out_dir, cache, fp)
        else:
            log(f"reusing the parts built for {fp} in {cache / 'out'}")
        check_limits(manifest)
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in out_dir.glob("tbench-gpu-kit-*"):
            stale.unlink()
        for name in [p["name"] for p in manifest["parts"]] + ["manifest.json"]:
            shutil.copy2(cache / "out" / fp / name, out_dir / name)
    check_limits(manifest)
    rel = os.path.relpath(out_dir, REPO)
    for p in manifest["parts"]:
        log(f"transfer {p['transfer']}: carry {rel}/manifest.json {rel}/{p['name']} ({p['size'] / MiB:.1f} MiB)")
    log(
        f"total {manifest['total_bytes'] / MiB:.1f} MiB in {len(manifest['parts'])} parts (limit "
        f"{PART_LIMIT // MiB} MiB each); built in {manifest['build_s']} s"
    )


main()
PY
