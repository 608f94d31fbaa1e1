"""Ctrl-C and SIGTERM: what counts as an interrupt, and the second signal that must still end the process promptly."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

from tbench.node import procs

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command


def is_interrupt(err: BaseException) -> bool:
    """Ctrl-C (KeyboardInterrupt) or a termination signal (Prefect raises its TerminationSignal for SIGTERM)."""
    return isinstance(err, KeyboardInterrupt) or (
        not isinstance(err, Exception) and getattr(err, "signal", None) in (signal.SIGINT, signal.SIGTERM)
    )


def signal_name(err: BaseException) -> str:
    sigterm = getattr(err, "signal", None) == signal.SIGTERM or (
        isinstance(err, KeyboardInterrupt) and str(err) == "SIGTERM"
    )
    return "SIGTERM" if sigterm else "Ctrl-C (SIGINT)"


def _exit_now(signum, frame) -> None:
    procs.kill_own_children()
    os.write(2, b"interrupted again: stopped without finishing the clean-up; the next run reclaims the device\n")
    os._exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def cli_signal_handlers() -> Iterator[None]:
    """For a terminal run: the first SIGINT or SIGTERM raises KeyboardInterrupt (the run stops its server, frees the
    lock and writes its manifest), a second one kills this process's children and exits at once."""

    def first(signum, frame):
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, _exit_now)
        raise KeyboardInterrupt("SIGTERM" if signum == signal.SIGTERM else "SIGINT")

    with _handlers(first):
        yield


@contextlib.contextmanager
def _handlers(handler) -> Iterator[None]:
    """SIGINT and SIGTERM go to `handler` for the duration (signals can only be set from the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def second_signal_exits() -> Iterator[None]:
    """While an interrupted run cleans up, another SIGINT/SIGTERM kills this process's children (the server,
    perf_analyzer, the CLI's Prefect API) and exits at once; the device lock is then reclaimed by the next run."""
    with _handlers(_exit_now):
        yield
