"""tbench.node.host_load: other processes' CPU while a run measures (the manifest's host.other_cpu_pct)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types

import psutil
import pytest

from tbench.node import host_load
from tbench.node.cpu_speed import cpu_speed
from tbench.node.host_load import HostLoad, process_cpu_seconds

BUSY_1S = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tbench-host-load"]


def test_other_processes_cpu_is_the_hosts_busy_time_less_the_runs_own(monkeypatch):
    """A host busy 1.5 cores, the run's own processes 0.5: others used one core (100% of one)."""
    start = time.monotonic()
    stamp = [start]  # the sampler's last clock reading: both counters are read at it, however late the thread runs

    def clock() -> float:
        stamp[0] = time.monotonic()
        return stamp[0]

    monkeypatch.setattr(host_load, "time", types.SimpleNamespace(monotonic=clock))
    monkeypatch.setattr(host_load, "busy_cpu_seconds", lambda: 1.5 * (stamp[0] - start))
    monkeypatch.setattr(host_load, "process_cpu_seconds", lambda processes: 0.5 * (stamp[0] - start))
    with HostLoad(interval_s=0.05) as load:
        time.sleep(0.5)
    other = load.summary["other_cpu_pct"]
    assert other["mean"] == pytest.approx(100.0, abs=1.0) and other["max"] == pytest.approx(100.0, abs=5.0)
    assert load.summary["samples"] >= 5 and load.summary["seconds"] == pytest.approx(0.5, abs=0.2)


def test_a_child_that_ran_and_exited_between_samples_counts_as_the_runs_own():
    """perf_analyzer starts and exits within a point: its CPU is the run's (a reaped child's time), not others'."""
    me = psutil.Process()
    before = process_cpu_seconds([me])
    subprocess.run([sys.executable, "-c", BUSY_1S], check=True)
    assert process_cpu_seconds([me]) - before >= 0.9


def test_the_summary_fills_in_as_it_goes_and_the_sampler_stops_on_ctrl_c():
    with pytest.raises(KeyboardInterrupt), HostLoad(interval_s=0.05) as load:
        summary = load.summary  # what the manifest keeps a reference to
        time.sleep(0.3)
        assert summary["samples"] >= 1 and summary["other_cpu_pct"]["mean"] >= 0.0
        raise KeyboardInterrupt
    assert sampler_threads() == []  # nothing left behind
    assert summary is load.summary and set(summary) >= {"other_cpu_pct", "samples", "seconds", "cpus"}


def detached_busy_loop(seconds: float) -> psutil.Process:
    """A busy process that is not under this one (its parent exits at once), as a container's server is."""
    loop = BUSY_1S.replace("1.0", str(seconds))
    quiet = "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"  # else run() waits for the loop to end
    launcher = f"import subprocess, sys\nprint(subprocess.Popen([sys.executable, '-c', {loop!r}], {quiet}).pid)"
    pid = int(subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, check=True).stdout)
    return psutil.Process(pid)


def test_the_servers_processes_passed_as_own_are_not_others(monkeypatch):
    """A host whose only load is this process and a server in a container (not under it): passed as `own`, the
    server's CPU is the run's; not passed, it is a neighbour's."""
    server = detached_busy_loop(3.0)
    try:
        assert server.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
        monkeypatch.setattr(host_load, "busy_cpu_seconds", lambda: process_cpu_seconds([psutil.Process(), server]))
        with HostLoad(own=lambda: [server], interval_s=0.1) as with_server:
            time.sleep(0.5)
        cpu, wall = sum(server.cpu_times()[:2]), time.monotonic()
        with HostLoad(interval_s=0.1) as without:
            time.sleep(0.5)
        # the loop's own CPU over that span, as a share of one core: all of a core on an idle host, half of one
        # beside a busy loop on a 2-core one (a fixed figure failed there)
        used = 100 * (sum(server.cpu_times()[:2]) - cpu) / (time.monotonic() - wall)
        assert used > 20
        assert with_server.summary["other_cpu_pct"]["mean"] < 15
        assert without.summary["other_cpu_pct"]["mean"] == pytest.approx(used, rel=0.25)
    finally:
        server.kill()


def test_the_cpu_speed_is_read_before_and_after_the_sweeps_never_after_an_interrupt():
    readings = iter([30.0, 33.0])
    with HostLoad(interval_s=0.05, speed=lambda: next(readings)) as load:
        assert load.summary["cpu_speed"] == {"start": 30.0, "best": 30.0}  # read before the first sweep
        time.sleep(0.15)
    assert load.summary["cpu_speed"] == {"start": 30.0, "end": 33.0, "best": 33.0}
    assert set(load.summary["steal_pct"]) == {"mean", "max"} and load.summary["steal_pct"]["mean"] >= 0.0
    with pytest.raises(KeyboardInterrupt), HostLoad(interval_s=0.05, speed=lambda: 30.0) as stopped:
        raise KeyboardInterrupt
    assert stopped.summary["cpu_speed"] == {"start": 30.0, "best": 30.0}  # Ctrl-C stops at once
    assert sampler_threads() == []


def test_the_cpu_probe_reads_this_cores_speed_in_millions_of_steps():
    speeds = [cpu_speed(steps=50_000, repeats=3) for _ in range(3)]
    assert all(s > 1.0 for s in speeds)  # any core of this century runs a Python loop step in under a microsecond
    assert max(speeds) / min(speeds) < 1.5  # best of repeats: steady on an idle-ish core
