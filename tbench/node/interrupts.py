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
    lock and writes its manifest), a second one kills this process's children and exits at once. Inside
    `interrupt_held` the KeyboardInterrupt waits until the block ends."""

    def first(signum, frame):
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, _exit_now)
        name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT"
        if _held.depth:
            _held.pending = name
            return
        raise KeyboardInterrupt(name)

    with _handlers(first):
        yield


class _Held:
    depth = 0  # interrupt_held blocks the main thread is in
    pending = ""  # the signal that arrived in one, raised as it ends


_held = _Held()


@contextlib.contextmanager
def interrupt_held() -> Iterator[None]:
    """A first interrupt that arrives inside this block is raised when it ends, not in the middle of it. For writes
    that must not be cut: Rich writes a line, flushes it, then clears its buffer, and a KeyboardInterrupt raised
    between the flush and the clear printed the line twice (seen when a Ctrl-C came as a point's line was printed).
    Only the main thread, where Python runs signal handlers, holds; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held.depth += 1
    try:
        yield
    finally:
        _held.depth -= 1
        if not _held.depth and _held.pending:
            name, _held.pending = _held.pending, ""
            raise KeyboardInterrupt(name)


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
