"""Which path tensors took between Triton and the python-backend runtime (DLPack or NumPy), as each model's
instances said at initialize (model.py's TENSOR_MARK lines in the server's log), for the manifest and the report's
"Tensors" line under "Served by"."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tbench.triton.serving import marked_reports

TENSOR_MARK = "TBENCH_TENSORS "  # tbench/triton/python_backend/model.py prints this and a JSON object per instance


def tensor_reports(log_text: str) -> dict[str, dict[str, str]]:
    """{Triton model name: {"path": dlpack | numpy, "why": ...}}; the last instance's line where several printed."""
    paths: dict[str, dict[str, str]] = {}
    for report in marked_reports(log_text, TENSOR_MARK):
        if "path" in report:
            paths[str(report["model"])] = {"path": str(report["path"]), "why": str(report.get("why", ""))}
    return paths


def server_tensor_paths(log_path: str | Path) -> dict[str, dict[str, str]]:
    """The paths a server's log records; none for a server whose log is not ours (remote) or a native backend."""
    log = Path(log_path)
    return tensor_reports(log.read_text(errors="replace")) if log.is_file() else {}


def path_words(report: Mapping[str, str]) -> str:
    return f"through {'DLPack' if report['path'] == 'dlpack' else 'NumPy'} ({report['why']})"


def tensor_words(triton_names: Mapping[str, list[str]], paths: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """Per format, the path its runtime's tensors took in words (the report's "Tensors" line); `triton_names`: format
    -> the Triton models behind it (an ensemble's parts, each named). A format no runtime reported for (a native
    backend) has none."""
    worded = {}
    for fmt, names in triton_names.items():
        reported = [(name, paths[name]) for name in names if name in paths]
        if not reported:
            continue
        if len(names) == 1:
            worded[fmt] = path_words(reported[0][1])
        else:
            worded[fmt] = ", ".join(f"{name} {path_words(report)}" for name, report in reported)
    return worded
