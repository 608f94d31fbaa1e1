"""A machine's cache folder kept under a size: the conversions (~/.cache/tbench/conversions) and a worker's fetched
uploads (~/.cache/tbench/inputs) each grow by a model per new model, option or tool version, and a worker that runs for
weeks would otherwise fill its disk with them. Each entry is one subfolder; using one marks it (its mtime), and when
the folder is over its bound the least recently used entries go first. An entry used within the last IN_USE_S is
never removed (another run on this machine may be copying from it), nor is the one just written."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from tbench.core.errors import ConfigError

LIMIT_ENV = "TBENCH_CACHE_MAX_GIB"  # per cache folder; 0: no bound
DEFAULT_MAX_GIB = 20.0
IN_USE_S = 3600.0
# what a killed run leaves half-written (`.<key>.<pid>.tmp`, `<digest>.partial`): removed once this old
STALE_S = 86400.0


def max_bytes() -> int | None:
    """The bound of each cache folder, from TBENCH_CACHE_MAX_GIB (None: unbounded)."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    try:
        gib = float(text) if text else DEFAULT_MAX_GIB
    except ValueError:
        gib = -1.0
    if not gib >= 0 or gib == float("inf"):  # also NaN
        raise ConfigError(f"{LIMIT_ENV}={text!r} is not a size in GiB: set it to e.g. 20, or 0 for no bound")
    return int(gib * 2**30) if gib else None


def used(entry: Path) -> None:
    """Mark an entry as used now (its mtime), so that it is the last to go."""
    try:
        os.utime(entry)
    except OSError:  # removed meanwhile, or read-only: nothing to keep fresh
        pass


def _size(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def _half_written(path: Path) -> bool:
    return path.name.endswith((".tmp", ".partial")) or path.name.startswith(".trash-")


def _remove(path: Path) -> None:
    """Renamed out of the way first: a reader sees the whole entry or none of it."""
    trash = path.with_name(f".trash-{path.name}.{os.getpid()}")
    try:
        path.rename(trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def trim(root: Path, keep: Path | None = None, limit: int | None = None, now: float | None = None) -> list[Path]:
    """Remove the least recently used entries of `root` until it holds at most `limit` bytes (max_bytes() when not
    given), and half-written leftovers older than STALE_S; returns what was removed, oldest first."""
    limit = max_bytes() if limit is None else limit
    now = time.time() if now is None else now
    removed: list[Path] = []
    entries: list[tuple[float, int, Path]] = []
    try:
        children = list(root.iterdir())
    except OSError:
        return removed
    for path in children:
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if _half_written(path):
            if path.name.startswith(".trash-") or now - mtime > STALE_S:
                _remove(path) if path.is_dir() else path.unlink(missing_ok=True)
                removed.append(path)
        elif path.is_dir():
            entries.append((mtime, _size(path), path))
    if limit is None:
        return removed
    total = sum(size for _, size, _ in entries)
    for mtime, size, path in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if path == keep or now - mtime < IN_USE_S:
            continue
        _remove(path)
        removed.append(path)
        total -= size
    return removed
