"""A reload's tail: Triton answers a load once the new version serves, then releases the version it replaced in a
detached thread (core's model_lifecycle.cc: the old model's deleter runs `std::thread(...).detach()` and logs
"successfully unloaded '<name>' version <n>"). Its instances stop meanwhile (a python-backend stub exits, a GPU
model frees its memory), which must not fall in a measured window: TritonServer.load waits for that line in the
log of a server tbench started (a remote server's log is not ours to read: nothing to wait for there)."""

from __future__ import annotations

import time
from pathlib import Path

# a reload that replaced nothing (the same config and files) logs no release: not waited for longer than this
RELEASE_TIMEOUT_S = 10.0


def released_line(name: str) -> str:
    return f"successfully unloaded '{name}' version"


def log_offset(log_path: Path | None) -> int | None:
    """Where the server's log ends now (a load's release is looked for after it); None without a log to read."""
    try:
        return log_path.stat().st_size if log_path is not None else None
    except OSError:
        return None


def wait_released(
    log_path: Path | None, name: str, offset: int | None, timeout_s: float = RELEASE_TIMEOUT_S, poll_s: float = 0.05
) -> bool:
    """Wait until the log says, after `offset`, that a version of `name` was released; False when it did not within
    `timeout_s` (or there is no log): the caller goes on either way."""
    if offset is None or log_path is None:
        return False
    line = released_line(name).encode()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with log_path.open("rb") as log:
                log.seek(offset)
                if line in log.read():
                    return True
        except OSError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
