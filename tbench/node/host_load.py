"""The host's CPU load from other processes while a run measures: a noisy neighbour, the commonest cause of a step in
a benchmark's history on a shared node, put in the manifest so that the history can name it (tbench.history.attribute).

Other processes' CPU = the host's busy CPU time (psutil.cpu_times: all but idle, iowait and steal) minus the CPU time
of the run's own processes: this process and every process under it (perf_analyzer, an embedded or local
tritonserver and its backend stubs), and the server's processes where they are not ours (a container's, passed as
`own`). A process's time counts its reaped children's (children_user/system), so a perf_analyzer that started and
exited between two samples is still counted as ours. Sampled from a daemon thread every `interval_s` seconds; in %
of one core (200 = two cores busy). Beside it, the time the hypervisor gave to others (steal, on a VM) and the CPU's
speed just before and just after the sweeps (tbench.node.cpu_speed): what a comparison needs to tell a changed model
from a changed machine.

    with HostLoad(own=server.processes) as load:
        ...  # the measured sweeps
    load.summary  # {"other_cpu_pct": {"mean": 12.5, "max": 40.1}, "steal_pct": {...}, "cpu_speed": {"start": 37.1,
                  #  "end": 36.9, "best": 37.1}, "samples": 30, ...}
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psutil

from tbench.node.cpu_speed import cpu_speed

INTERVAL_S = 1.0  # long enough that a sample costs nothing next to the run, short enough for a 5 s point
OWN_REFRESH_S = 10.0  # how often the processes passed as `own` are looked up again


def busy_cpu_seconds() -> float:
    """CPU seconds the host's CPUs have been busy since boot, all CPUs together."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0) + getattr(t, "steal", 0.0)  # steal: the hypervisor's, not a process's
    return sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # guest is in user already


def steal_seconds() -> float:
    """CPU seconds the hypervisor ran something else while this VM's CPUs wanted to run (0 on bare metal)."""
    return getattr(psutil.cpu_times(), "steal", 0.0)


def process_cpu_seconds(processes: list[psutil.Process]) -> float:
    """CPU seconds the processes (each once) and their reaped children have used."""
    total = 0.0
    for p in {p.pid: p for p in processes}.values():
        try:
            t = p.cpu_times()
        except psutil.Error:  # gone, or another user's: its time is then counted as another process's
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class HostLoad:
    """Samples other processes' CPU over a span (a context manager); `summary` is filled in as it goes, so a run
    interrupted mid-sweep still has what was seen up to then."""

    def __init__(
        self,
        own: Callable[[], list[psutil.Process]] = lambda: [],
        interval_s: float = INTERVAL_S,
        speed: Callable[[], float] = cpu_speed,
    ):
        self.own = own  # the run's processes that are not under this one (a container's)
        self.interval_s = interval_s
        self.speed = speed
        self.summary: dict = {}
        self._samples: list[float] = []  # each interval's other processes' CPU, % of one core
        self._seconds = 0.0
        self._other_seconds = 0.0
        self._steal_samples: list[float] = []  # each interval's stolen CPU, % of one core
        self._steal_seconds = 0.0
        self._own: list[psutil.Process] = []
        self._own_refresh_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _own_processes(self) -> list[psutil.Process]:
        me = psutil.Process()
        if time.monotonic() >= self._own_refresh_at:  # finding a container's processes asks docker: not every sample
            try:
                self._own = list(self.own())
            except Exception:  # a server that stopped answering: its processes are no longer ours to count
                self._own = []
            self._own_refresh_at = time.monotonic() + OWN_REFRESH_S
        try:
            return [me, *me.children(recursive=True), *self._own]
        except psutil.Error:
            return [me, *self._own]

    def _reading(self) -> tuple[float, float, float, float]:
        own = self._own_processes()  # looked up first: the clock and the counters are then read back to back
        return time.monotonic(), busy_cpu_seconds(), process_cpu_seconds(own), steal_seconds()

    def _run(self) -> None:
        last = self._reading()
        while not self._stop.wait(self.interval_s):
            last = self._add(last)
        self._add(last)  # the part since the last sample, at stop

    def _add(self, last: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
        now = self._reading()
        wall = now[0] - last[0]
        if wall < 0.05:  # too short to read a rate from
            return last
        # a process of ours that exited unreaped takes its time with it: never below zero
        other = max(0.0, (now[1] - last[1]) - max(0.0, now[2] - last[2]))
        other = min(other, wall * psutil.cpu_count())  # counters read a moment apart can overshoot a little
        steal = min(max(0.0, now[3] - last[3]), wall * psutil.cpu_count())
        self._samples.append(100.0 * other / wall)
        self._steal_samples.append(100.0 * steal / wall)
        self._seconds += wall
        self._other_seconds += other
        self._steal_seconds += steal
        mean = 100.0 * self._other_seconds / self._seconds  # over the whole span: a short last interval weighs less
        stolen = 100.0 * self._steal_seconds / self._seconds
        self.summary.update(
            other_cpu_pct={"mean": round(mean, 1), "max": round(max(self._samples), 1)},
            steal_pct={"mean": round(stolen, 1), "max": round(max(self._steal_samples), 1)},
            samples=len(self._samples),
            seconds=round(self._seconds, 1),
            interval_s=self.interval_s,
            cpus=psutil.cpu_count(),
        )
        return now

    def _read_speed(self, when: str) -> None:
        speed = self.summary.setdefault("cpu_speed", {})
        speed[when] = self.speed()
        speed["best"] = max(speed.get("start", 0.0), speed.get("end", 0.0))  # what comparisons read (cpu_speed.py)

    def __enter__(self) -> HostLoad:
        self._read_speed("start")  # before the sampler and the sweeps: nothing else of ours runs
        self._thread = threading.Thread(target=self._run, name="tbench-host-load", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.stop()
        if exc_type is None:  # after the sweeps; an interrupted run stops at once
            self._read_speed("end")

    def stop(self) -> None:
        """Stops sampling (also on Ctrl-C: the thread wakes at once and exits; being a daemon, it never holds the
        process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
