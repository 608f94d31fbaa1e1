"""tbench.results.report: the rows that say what the machine did while a run measured (tbench.node.host_load)."""

from __future__ import annotations

from tbench.results.report import host_rows


def test_the_hardware_table_says_the_cpu_probe_and_the_load_beside_the_sweeps():
    host = {
        "cpu_speed": {"start": 42.9, "end": 43.49, "best": 43.49},
        "other_cpu_pct": {"mean": 1.2, "max": 6.0},
        "steal_pct": {"mean": 0.3, "max": 4.0},
    }
    assert host_rows(host) == [
        ("CPU probe (M steps/s)", "42.9 before, 43.5 after"),
        ("While measuring (% of one CPU)", "other processes 1.2 (max 6.0), steal 0.3 (max 4.0)"),
    ]


def test_an_interrupted_run_says_it_has_no_after_reading_and_an_old_manifest_says_nothing():
    stopped = host_rows({"cpu_speed": {"start": 39.53, "best": 39.53}, "other_cpu_pct": {"mean": 1.0, "max": 4.0}})
    assert stopped == [
        ("CPU probe (M steps/s)", "39.5 before (the run stopped before the end)"),
        ("While measuring (% of one CPU)", "other processes 1.0 (max 4.0)"),
    ]
    assert host_rows({}) == []
