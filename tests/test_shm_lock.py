"""The host-wide lock of system shared memory (perf_analyzer names its regions after the tensors): one process at a
time holds it, and a killed holder leaves nothing held."""

from __future__ import annotations

import subprocess
import sys
import time

from tbench.node import shm

HOLD = """
import sys, time
from pathlib import Path
from tbench.node import shm
shm.SYSTEM_REGIONS_LOCK = Path(sys.argv[1])
with shm.system_regions_held():
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def holder(lock, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_waits_for_the_first_and_a_killed_holder_holds_nothing(tmp_path, monkeypatch):
    lock = tmp_path / "shm.lock"
    monkeypatch.setattr(shm, "SYSTEM_REGIONS_LOCK", lock)
    first = holder(lock, 1.5)
    started = time.monotonic()
    with shm.system_regions_held():
        assert time.monotonic() - started > 1.0  # it waited for the first to finish measuring
    first.wait()
    killed = holder(lock, 60)
    killed.kill()
    killed.wait()
    started = time.monotonic()
    with shm.system_regions_held():
        assert time.monotonic() - started < 1.0
