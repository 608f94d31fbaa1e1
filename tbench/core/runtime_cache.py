"""Loaded runtimes kept for the next call: loading a SavedModel, a big ONNX file or an AOTInductor package takes
seconds, and correctness, accuracy and a model file's probe each run the same file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

# Loaded runtimes by (kind, path, mtime): repeated calls skip the load (a SavedModel or a big ONNX file takes
# seconds), a rewritten file reloads, and only the last few stay in memory.
_RUNTIMES: dict[tuple[str, str, int], object] = {}
_MAX_RUNTIMES = 4


def cached(kind: str, path: Path, load: Callable[[], object]):
    key = (kind, str(path), Path(path).stat().st_mtime_ns)
    if key not in _RUNTIMES:
        if len(_RUNTIMES) >= _MAX_RUNTIMES:
            del _RUNTIMES[next(iter(_RUNTIMES))]  # oldest first: dicts keep insertion order
        _RUNTIMES[key] = load()
    return _RUNTIMES[key]
