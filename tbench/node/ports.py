"""Ports on the loopback address: a free one to bind, and whether a given one is taken.

A port picked for a server is bound seconds later by another process (tritonserver, `docker run`, the Prefect API).
In between, two things can take it: another picker on this host (two runs, two test workers), and any process's
outgoing connection, whose local port the kernel takes from the ephemeral range, as it takes the ports it hands to
bind(0). So a port is picked outside that range, and reserved across processes: its picker holds a lock on a file
named after it until it releases the port or exits (the kernel drops the lock with the process)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

RESERVATIONS = Path(tempfile.gettempdir()) / "tbench-ports"
LOWEST = 10000  # below: well-known and registered services
_held: dict[int, int] = {}  # port -> the descriptor holding its lock
_pick = random.SystemRandom()  # tests seed `random`; two workers with one seed would pick the same ports


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def candidates() -> list[int]:
    low, high = ephemeral_range()
    outside = [p for p in range(LOWEST, 65536) if not low <= p <= high]
    return outside if len(outside) >= 1000 else list(range(LOWEST, 65536))


def _reserve(port: int) -> bool:
    """Take the port's lock; False when another process holds it. Where the lock files cannot be written, the
    reservation is skipped and only the check for a listener remains."""
    try:
        RESERVATIONS.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):
            RESERVATIONS.chmod(0o1777)  # every user's runs share the reservations
        fd = os.open(RESERVATIONS / str(port), os.O_CREAT | os.O_RDONLY, 0o444)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(RESERVATIONS / str(port)).st_ino:
            raise OSError("released and removed while we opened it")  # another picker may hold the new file
    except OSError:
        os.close(fd)
        return False
    _held[port] = fd
    return True


def free_port() -> int:
    """A port that nobody listens on or has reserved, reserved for this process until `release(port)`."""
    pool = candidates()
    for _ in range(500):
        port = _pick.choice(pool)
        if port in _held or not _reserve(port):
            continue
        if port_in_use(port):
            release(port)
            continue
        return port
    raise OSError(f"no free port on 127.0.0.1 between {LOWEST} and 65535 outside the ephemeral range")


def release(port: int) -> None:
    """Give the port up, and its file (removed while locked: a picker that opened it before checks, see _reserve)."""
    fd = _held.pop(port, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            (RESERVATIONS / str(port)).unlink()
        os.close(fd)


def port_in_use(port: int) -> bool:
    """Whether binding 127.0.0.1:port fails, with SO_REUSEADDR as servers bind (a port in TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False
