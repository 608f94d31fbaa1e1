"""A point's windows as perf_analyzer measures them, told to the progress listeners (the CLI's bar) while the point
runs: each new window's throughput and how far the last 3 are from agreeing. A slow model's point takes a minute or
more (nnUNet's 64^3 windows last ~17 s each on 2 cores), and without this the terminal shows only a spinner."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from tbench.core import progress
from tbench.loadgen.perf_analyzer import Point, parse_windows

POLL_S = 0.5  # how often the log is read: a window lasts at least a second


def stability_spread_pct(throughputs: list[float]) -> float | None:
    """How far the last 3 windows' throughputs lie from their mean at most, in % (perf_analyzer's stability test:
    each within the band of the mean); None before there are 3."""
    if len(throughputs) < 3:
        return None
    last = throughputs[-3:]
    mean = sum(last) / 3
    return 100 * max(abs(t - mean) for t in last) / mean if mean > 0 else None


def tell_new_windows(log_path: Path, point: Point, band_pct: float | None, told: int) -> int:
    """Emit a `point_window` event for the log's newest window if it has more than `told`; returns how many it has."""
    try:
        windows = parse_windows(log_path.read_text(errors="replace"))
    except OSError:  # not written yet
        return told
    if len(windows) > told:
        throughputs = [w.throughput for w in windows]
        progress.emit(
            "point_window",
            point=point.describe(),
            window=len(windows),
            throughput=throughputs[-1],
            spread_pct=stability_spread_pct(throughputs),
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
