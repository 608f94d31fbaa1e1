"""tbench.stages.window_progress: a point's windows told while perf_analyzer measures it, from its real log."""

from __future__ import annotations

import threading

import pytest
from conftest import GOLDEN

from tbench.core import progress
from tbench.core.enums import Scenario
from tbench.loadgen.perf_analyzer import Point
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


def test_the_spread_is_perf_analyzers_test_the_last_3_windows_from_their_mean():
    assert stability_spread_pct([21.9536, 23.9791]) is None  # fewer than 3 cannot be judged
    mean = (21.9536 + 23.9791 + 23.8697) / 3
    assert stability_spread_pct([5.0, 21.9536, 23.9791, 23.8697]) == pytest.approx(100 * (mean - 21.9536) / mean)


def test_the_newest_window_is_told_once(told, tmp_path):
    assert tell_new_windows(tmp_path / "not-yet.log", POINT, 20.0, 0) == 0 and told == []
    assert tell_new_windows(LOG, POINT, 20.0, 0) == 3
    assert told == [
        {
            "point": "online batch 1 concurrency 4",
            "window": 3,
            "throughput": 23.8697,
            "spread_pct": stability_spread_pct([21.9536, 23.9791, 23.8697]),
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
