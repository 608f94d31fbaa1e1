"""The Markdown report's pieces that need no run: a scenario whose every point was flagged still has its section."""

from __future__ import annotations

import pandas as pd

from tbench.core.metrics import OK, UNSTABLE
from tbench.results.format_section import flagged_only_lines, scenario_rows


def rows(*statuses: tuple[str, str]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"scenario": s, "status": st, "batch_size": 1, "concurrency": 1, "request_rate": None} for s, st in statuses]
    )


def test_a_scenario_with_no_point_within_its_checks_says_so_in_its_section():
    results = rows(("offline", UNSTABLE), ("offline", UNSTABLE), ("online", OK))
    offline = flagged_only_lines(results, "offline", scenario_rows(results, "offline"))
    assert offline[0] == "### Offline scenario" and f"(2 {UNSTABLE})" in offline[2]
    assert flagged_only_lines(results, "online", scenario_rows(results, "online")) == []  # it has its own section
    assert flagged_only_lines(results, "rate", scenario_rows(results, "rate")) == []  # not measured: nothing to say
