"""Measured points kept for re-use: a re-run with the same inputs (`reuse_measurements`) takes a point it already
measured from here instead of measuring it again, so an interrupted run resumes where it stopped and a repeated
run costs only what is new.

A point's key holds everything that decides its numbers: the served model (source digest, format, precision, io spec),
the Triton configuration, the server (mode; its binary, image or address; the id and version it reports), the machine
(CPU model and cores, GPUs by UUID, driver and CUDA versions), the measurement settings, the perf_analyzer input data,
the versions of perf_analyzer, the embedded server and the runtimes the python backend runs (onnxruntime, torch,
tensorflow) and its model.py, and the point itself. Only stable (ok) points are kept. An entry is the
result row plus the perf_analyzer CSV and log it came from, copied into the new run folder on a hit, so the run
folder stays complete and `tbench compare` still reads the point's noise. The row's `reused_from` names the run
that measured it. The cache is a local folder (per worker: the machine is part of the key anyway).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

from tbench.core.layout import perf_log_for
from tbench.core.storage import file_sha256

CACHE_ENV = "TBENCH_POINT_CACHE_DIR"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "tbench" / "points"))


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:32]


def tool_versions() -> dict[str, str]:
    """perf_analyzer comes with tritonclient; the embedded server with nvidia-pytriton; the python backend runs this
    environment's runtimes (embedded and local servers)."""
    import importlib.metadata

    versions = {}
    for dist in (
        "tritonclient",
        "nvidia-pytriton",
        "onnxruntime",
        "onnxruntime-gpu",
        "torch",
        "tensorflow",
        "tensorflow-cpu",
    ):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "unknown"
    return versions


def file_digest(path: Path | None) -> str | None:
    if path is None or not Path(path).is_file():
        return None
    return file_sha256(path)


class PointCache:
    """`read`: take cached points (`--reuse`); every run keeps its stable points, so one interrupted or killed
    without `--reuse` is resumed by a re-run with it, as its message says."""

    def __init__(self, context: dict, root: Path | None = None, read: bool = True):
        self.context = context
        self.context_key = digest(context)
        self.root = Path(root) if root is not None else cache_root()
        self.read = read

    def for_model(self, static: dict) -> PointCache:
        """The same cache narrowed to one served model (its format, backend and config columns)."""
        return PointCache({**self.context, "static": static}, self.root, self.read)

    def _dir(self, point_key: dict) -> Path:
        return self.root / digest({"context": self.context_key, "point": point_key})

    def get(self, point_key: dict, run_dir: Path) -> dict | None:
        """The cached row for a point, its files copied into run_dir; None when not cached (or not read)."""
        if not self.read:
            return None
        entry = self._dir(point_key)
        try:
            row = json.loads((entry / "row.json").read_text())
        except (OSError, ValueError):
            return None
        for rel in (row.get("source_file"), perf_log_for(row["source_file"]) if row.get("source_file") else None):
            if rel and (entry / "files" / rel).is_file():
                target = Path(run_dir) / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(entry / "files" / rel, target)
        return row

    def put(self, point_key: dict, row: dict, run_dir: Path, run_id: str) -> None:
        """Keep a stable point (written whole under a temporary name, then renamed)."""
        if row.get("status") != "ok":
            return
        entry = self._dir(point_key)
        if entry.exists():
            return
        tmp = entry.with_name(f".{entry.name}.{uuid.uuid4().hex[:8]}.tmp")
        (tmp / "files").mkdir(parents=True)
        kept = {k: v for k, v in row.items() if k != "composing"}
        if not isinstance(kept.get("reused_from"), str):  # measured by this run (NaN), not itself re-used
            kept["reused_from"] = run_id
        (tmp / "row.json").write_text(json.dumps(kept, default=str))
        if row.get("composing"):
            (tmp / "composing.json").write_text(json.dumps(row["composing"], default=str))
        for rel in (row.get("source_file"), perf_log_for(row["source_file"]) if row.get("source_file") else None):
            if rel and (Path(run_dir) / rel).is_file():
                (tmp / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(run_dir) / rel, tmp / "files" / rel)
        try:
            tmp.rename(entry)
        except OSError:  # another run kept the same point meanwhile
            shutil.rmtree(tmp, ignore_errors=True)

    def composing(self, point_key: dict) -> list[dict]:
        try:
            return json.loads((self._dir(point_key) / "composing.json").read_text())
        except (OSError, ValueError):
            return []
