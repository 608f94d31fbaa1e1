"""The summary's best points (tbench.results.summary): per format and scenario, and per shape set in a --shape sweep."""

from __future__ import annotations

import pandas as pd

from tbench.core.metrics import THROUGHPUT
from tbench.results.report import summary_lines
from tbench.results.summary import summarize


def _points(rows: list[tuple]) -> pd.DataFrame:
    columns = ["format", "scenario", "batch_size", "concurrency", "request_rate", "shapes", "status"]
    frame = pd.DataFrame([r[:7] for r in rows], columns=columns)
    frame[THROUGHPUT.column] = [r[7] for r in rows]
    frame["p99_ms"] = [r[8] for r in rows]
    frame["avg_ms"] = [r[8] / 2 for r in rows]
    return frame


SWEEP = _points(
    [
        ("onnx", "offline", 1, 1, None, "ids=16", "ok", 800.0, 2.0),
        ("onnx", "offline", 4, 1, None, "ids=16", "ok", 2300.0, 2.6),
        ("onnx", "offline", 1, 1, None, "ids=128", "ok", 360.0, 3.8),
        ("onnx", "offline", 4, 1, None, "ids=128", "ok", 600.0, 8.8),
        ("onnx", "online", 1, 8, None, "ids=128", "unstable", 9999.0, 1.0),  # flagged: never a best
        ("onnx", "online", 1, 4, None, "ids=128", "ok", 500.0, 9.0),
    ]
)


def test_one_best_per_format_and_scenario_without_a_sweep():
    summary = summarize(SWEEP[SWEEP["shapes"] == "ids=16"])
    assert summary["points"] == 2 and summary["points_flagged"] == 0
    (best,) = summary["best"]
    assert "shapes" not in best and best["at"] == "batch size 4" and best["best_throughput_infer_per_s"] == 2300.0
    assert "Shapes" not in "\n".join(summary_lines(summary))


def test_a_shape_sweep_has_a_best_per_shape_set_flagged_points_left_out():
    summary = summarize(SWEEP)
    assert summary["points_ok"] == 5 and summary["points_flagged"] == 1
    assert [(b["scenario"], b["shapes"], b["at"], b["best_throughput_infer_per_s"]) for b in summary["best"]] == [
        ("offline", "ids=16", "batch size 4", 2300.0),
        ("offline", "ids=128", "batch size 4", 600.0),
        ("online", "ids=128", "concurrency 4", 500.0),
    ]
    assert summary["best"][1]["min_avg_ms"] == 1.9  # the lowest at its own shapes, not the shorter set's 1.0
    table = "\n".join(summary_lines(summary))
    assert "| Shapes " in table and "ids=128" in table
