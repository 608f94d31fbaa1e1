"""POSIX shared memory that a process group leaves behind.

Triton's python backend and perf_analyzer (offline points: `--shared-memory system`) create regions under /dev/shm and
remove them on a clean exit; a killed process leaves them, and they hold memory until the machine reboots. Every
region is mapped by the server that uses it (perf_analyzer registers its regions with the server), so the regions
to remove are the ones a server's process group maps, removed once the group is gone. The python backend's regions
also carry a name prefix of the server's own (`--backend-config=python,shm-region-prefix-name`), so they are found by
name once the server is gone, including those of stubs that exited before anyone looked at what they mapped.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")
SYSTEM_REGIONS_LOCK = Path(tempfile.gettempdir()) / "tbench-system-shm.lock"


@contextlib.contextmanager
def system_regions_held() -> Iterator[None]:
    """perf_analyzer names its system shared memory regions after the tensors (/dev/shm/output__0, whatever the run):
    two measuring through system shared memory on one host at once (runs on two GPUs of a node, each under its own
    device lock) would open, and remove, each other's regions. One holds this host-wide lock while it measures; the
    kernel drops it with the process, so a killed run leaves nothing held."""
    fd = os.open(SYSTEM_REGIONS_LOCK, os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the file releases the lock


def group_members(pgid: int) -> list[psutil.Process]:
    """The processes of one process group (a server and the stubs it started, orphaned or not)."""
    members = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                members.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return members


def mapped_regions(processes: list[psutil.Process]) -> set[Path]:
    """The /dev/shm files the processes map, read from /proc/PID/maps (psutil's memory_maps reads smaps: 20 ms for
    a tritonserver instead of 1)."""
    regions = set()
    prefix = f"{SHM_DIR}/"
    for p in processes:
        try:
            with open(f"/proc/{p.pid}/maps") as maps:
                for line in maps:
                    fields = line.rstrip("\n").split(None, 5)  # address perms offset dev inode [path]
                    if len(fields) == 6 and fields[5].startswith(prefix):
                        regions.add(Path(fields[5]))
        except OSError:
            pass
    return regions


def named(prefix: str | None) -> set[Path]:
    """The regions whose name starts with `prefix` (one server's python backend regions)."""
    if not prefix or not SHM_DIR.is_dir():
        return set()
    return {p for p in SHM_DIR.iterdir() if p.name.startswith(prefix) and p.is_file()}


def remove(regions: set[Path]) -> list[Path]:
    """Unlink the names (a process that still maps one keeps its memory until it unmaps it)."""
    removed = []
    for region in regions:
        try:
            region.unlink()
            removed.append(region)
        except OSError:
            pass
    return removed


def unmapped_regions() -> list[Path]:
    """Shared memory files no live process maps: what killed processes left behind (a region being created right
    now is unmapped for a moment, so callers look twice or only after their processes are gone)."""
    if not SHM_DIR.is_dir():
        return []
    mapped = mapped_regions(list(psutil.process_iter()))
    return sorted(p for p in SHM_DIR.iterdir() if p.is_file() and p not in mapped)
