"""The soak's count of its runs (benchmarks/soak_faults.py): a clean failure is one line with a run folder that says
why; a run with no folder anywhere and a run whose process died are counted apart, and a run with no stored copy
lost every point it measured."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from soak_faults import OUTCOMES, lost_points, outcome_counts, outcome_of  # noqa: E402

FOLDER = {"points": 3, "manifest": {"status": "failed", "error": "the server stopped"}}
STORED = {"points": 3, "manifest": {"status": "failed", "points": {"measured": 3}}}


def test_each_kind_of_failure_is_counted_apart():
    crash = "Flow run infrastructure exited with non-zero status code 1. Process exited with a general error."
    cases = [
        (("COMPLETED", "", FOLDER, STORED), "completed"),
        (("COMPLETED", "", FOLDER, None), "lost"),
        (("FAILED", "PerfAnalyzerError: the server stopped", FOLDER, STORED), "failed_cleanly"),
        (("FAILED", "ConfigError: only 0 MiB free", None, None), "failed_without_run_folder"),
        (("CRASHED", crash, None, None), "infrastructure_crashed"),
        (("CRASHED", crash, FOLDER, STORED), "infrastructure_crashed"),
        (("FAILED", "Traceback\n  File x\nError", FOLDER, STORED), "lost"),
        (("CRASHED", "", FOLDER, None), "lost"),
        (("RUNNING", "", {"points": 1, "manifest": {"status": "running"}}, None), "lost"),
    ]
    table = [{"outcome": outcome_of(*args)[0]} for args, _ in cases]
    assert [r["outcome"] for r in table] == [outcome for _, outcome in cases]
    assert outcome_counts(table) == {
        "completed": 1,
        "failed_cleanly": 1,
        "failed_without_run_folder": 1,
        "infrastructure_crashed": 2,
        "lost": 4,
    }
    assert set(outcome_counts([])) == set(OUTCOMES)


def test_a_run_without_a_stored_copy_lost_its_points():
    assert lost_points(FOLDER, None) == 3  # measured on the worker, in no store
    assert lost_points(FOLDER, {"points": 1, "manifest": {}}) == 2
    assert lost_points(FOLDER, STORED) == 0
    assert lost_points(None, {"points": 1, "manifest": {"points": {"measured": 3}}}) == 2
    assert lost_points(None, None) == 0  # nothing measured anywhere
