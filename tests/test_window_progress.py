"""tbench.stages.window_progress: a point's windows told while perf_analyzer measures it, from its real log."""

from __future__ import annotations

import threading

import pytest
from conftest import GOLDEN

from tbench.core import progress
from tbench.core.enums import Scenario
from tbench.loadgen.perf_analyzer import Point, Window, parse_windows
from tbench.stages import window_progress
from tbench.stages.window_progress import stability_spread_pct, tell_new_windows, windows_told

LOG = GOLDEN / "perf_analyzer" / "resnet50_online_b1_c4.log"  # 3 windows: 21.9536, 23.9791, 23.8697 infer/s
POINT = Point(Scenario.ONLINE, 1, 4)


@pytest.fixture
def told():
    events = []

    def on_event(event: str, **data) -> None:
        if event == "point_window":
            events.append(data)

    progress.subscribe(on_event)
    yield events
    progress.unsubscribe(on_event)


def test_the_spread_is_perf_analyzers_rule_max_over_min_of_the_last_3_windows_throughput_and_latency():
    windows = parse_windows(LOG.read_text())  # latencies 171,043, 167,298 and 169,320 us
    assert stability_spread_pct(windows[:2]) is None  # fewer than 3 cannot be judged
    assert stability_spread_pct([Window(0, 5.0, 1e6), *windows]) == pytest.approx(100 * (23.9791 / 21.9536 - 1))
    slow = [Window(1, 10.0, 100.0), Window(2, 10.0, 130.0), Window(3, 10.0, 110.0)]  # steady throughput, not latency
    assert stability_spread_pct(slow) == pytest.approx(30.0)


def test_the_newest_window_is_told_once(told, tmp_path):
    assert tell_new_windows(tmp_path / "not-yet.log", POINT, 20.0, 0) == 0 and told == []
    assert tell_new_windows(LOG, POINT, 20.0, 0) == 3
    assert told == [
        {
            "point": "online batch 1 concurrency 4",
            "window": 3,
            "throughput": 23.8697,
            "spread_pct": stability_spread_pct(parse_windows(LOG.read_text())),
            "band_pct": 20.0,
        }
    ]
    assert tell_new_windows(LOG, POINT, 20.0, 3) == 3 and len(told) == 1


def test_windows_are_told_as_the_log_grows_and_the_last_once_the_process_ends(told, tmp_path, monkeypatch):
    monkeypatch.setattr(window_progress, "POLL_S", 0.01)
    log = tmp_path / "point.log"
    lines = LOG.read_text().splitlines(keepends=True)
    with windows_told(log, POINT, None):
        with log.open("w") as f:
            for line in lines:
                f.write(line)
                f.flush()
                threading.Event().wait(0.005)
    windows = [e["window"] for e in told]
    assert windows == sorted(set(windows)) and windows[-1] == 3
    assert told[-1]["band_pct"] is None  # an open-loop point: no band to meet


def test_a_failing_listener_never_reaches_the_measurement(tmp_path, monkeypatch):
    monkeypatch.setattr(window_progress, "POLL_S", 0.01)

    calls = []

    def broken(event: str, **data) -> None:
        calls.append(event)
        raise RuntimeError("a display bug")

    log = tmp_path / "point.log"
    progress.subscribe(broken)
    try:
        with windows_told(log, POINT, 10.0):  # the block (perf_analyzer's run) ends as it would without the display
            log.write_text(LOG.read_text())
            threading.Event().wait(0.05)
    finally:
        progress.unsubscribe(broken)
    assert calls == ["point_window"]  # told once, failed, and the watcher stopped telling
