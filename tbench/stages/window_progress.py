"""A point's windows as perf_analyzer measures them, told to the progress listeners (the CLI's bar) while the point
runs: each new window's throughput and how far the last 3 are from agreeing. A slow model's point takes a minute or
more (nnUNet's 64^3 windows last ~17 s each on 2 cores), and without this the terminal shows only a spinner."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from tbench.core import progress
from tbench.loadgen.perf_analyzer import Point, Window, parse_windows

POLL_S = 0.5  # how often the log is read: a window lasts at least a second


def stability_spread_pct(windows: list[Window]) -> float | None:
    """How far apart the last 3 windows are, as perf_analyzer's stability rule reads them (max / min of the recent 3,
    of throughput and of latency alike, within 1 + the band), in %; None before there are 3."""
    last = windows[-3:]
    if len(last) < 3:
        return None
    ratios = [max(v) / min(v) for v in ([w.throughput for w in last], [w.latency_us for w in last]) if min(v) > 0]
    return 100 * (max(ratios) - 1) if len(ratios) == 2 else None


def tell_new_windows(log_path: Path, point: Point, band_pct: float | None, told: int) -> int:
    """Emit a `point_window` event for the log's newest window if it has more than `told`; returns how many it has."""
    try:
        windows = parse_windows(log_path.read_text(errors="replace"))
    except OSError:  # not written yet
        return told
    if len(windows) > told:
        progress.emit(
            "point_window",
            point=point.describe(),
            window=len(windows),
            throughput=windows[-1].throughput,
            spread_pct=stability_spread_pct(windows),
            band_pct=band_pct,
        )
    return max(told, len(windows))


@contextlib.contextmanager
def windows_told(log_path: Path, point: Point, band_pct: float | None) -> Iterator[None]:
    """While the block runs perf_analyzer into `log_path`, tell each window it finishes (`band_pct`: the stability
    band it must meet, None for an open-loop point, which is judged otherwise)."""
    stop, failed = threading.Event(), threading.Event()
    told = [0]

    def tell() -> bool:
        if failed.is_set():
            return False
        try:
            told[0] = tell_new_windows(log_path, point, band_pct, told[0])
            return True
        except Exception:  # the display only: a listener's error must not reach the measurement, nor be told again
            failed.set()
            return False

    def watch() -> None:
        while not stop.wait(POLL_S) and tell():
            pass

    thread = threading.Thread(target=watch, name="perf-windows", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        tell()  # a window that ended with the process
