"""Progress events from inside stages to whoever listens (the CLI's rich display, Prefect progress artifacts)."""

from __future__ import annotations

import logging
from collections.abc import Callable

Listener = Callable[..., None]
_listeners: list[Listener] = []


def subscribe(listener: Listener) -> None:
    _listeners.append(listener)


def unsubscribe(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def emit(event: str, **data) -> None:
    for listener in list(_listeners):
        listener(event, **data)


def warn(line: str) -> None:
    """A line the user should read before the figures: on the terminal (the CLI's listener) and in the run's log."""
    logging.getLogger("prefect.tbench").warning(line)
    emit("warning", line=line)
