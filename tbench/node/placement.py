"""Where a run's processes execute: the server on one CPU set, the load generator (and the rest of tbench) on another.

Serious harnesses pin what they measure (pyperf's isolated CPUs, MLPerf's LoadGen off the system under test's cores):
on 2 shared cores, perf_analyzer's client threads, our monitor and Prefect's API land wherever the OS puts them, and
the server's compute moves from core to core with them. That spread is ours, and it is removed by giving the server
and the client disjoint CPU sets: the server (its python-backend stubs, which it starts, inherit its set) through
`taskset` (or docker's `--cpuset-cpus`), the client by moving this process's threads and its other children (Prefect's
ephemeral API server), whose children (perf_analyzer) inherit it. SMT siblings stay on one side: a load generator on
the server's sibling would share its core. The runtimes' thread counts follow the server's set (one intra-op thread
per CPU per instance), and the placement goes into the manifest.

Plain functions over `os.sched_*affinity` and /sys; no Prefect.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

CLIENT_SHARE = 0.25  # of the CPUs, for perf_analyzer and tbench: its client threads need far less than the server
# Fewer physical cores than this: not pinned. On 2 cores the server's share is one core, whose own unsteadiness on a
# shared VM (benchmarks/results/machine_noise.json) outweighs what pinning removes: on the 2-core Intel VM the small
# ResNet-50's per-point CV over 5 fresh runs was 6.18% pinned against 2.81-3.03% unpinned (benchmarks/real_aa.py at
# 73f0dd2), and 2.62% pinned against 1.99-2.46% unpinned with the placements run round by round on a steady machine
# (benchmarks/results/real_aa.json at d87dfdd).
# TBENCH_PIN_MIN_CORES sets another bound (the benchmark that measures both sets it to 2).
MIN_CORES = 4
TOPOLOGY = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Placement:
    """The CPU sets of one run; empty sets: nothing pinned (`reason` says why)."""

    server: tuple[int, ...] = ()
    client: tuple[int, ...] = ()
    reason: str = ""

    @property
    def pinned(self) -> bool:
        return bool(self.server and self.client)

    def server_threads(self, instances: int, cpu_cores: int) -> int:
        """The runtime's intra-op threads per instance: the server's CPUs shared by its instances."""
        cpus = len(self.server) if self.pinned else cpu_cores
        return max(1, cpus // max(1, instances))

    def wrap(self, argv: list[str]) -> list[str]:
        """A command started on the server's CPUs (children included), through taskset."""
        if not self.pinned:
            return argv
        return [taskset(), "-c", cpu_list(self.server), *argv]

    def manifest(self) -> dict:
        return {
            "pinned": self.pinned,
            "server_cpus": cpu_list(self.server),
            "client_cpus": cpu_list(self.client),
            "reason": self.reason,
        }


def cpu_list(cpus: tuple[int, ...]) -> str:
    return ",".join(str(c) for c in cpus)


def taskset() -> str:
    found = shutil.which("taskset")
    if not found:  # util-linux: on every Debian; a node without it runs unpinned (plan_placement says so)
        raise FileNotFoundError("taskset")
    return found


def siblings(cpu: int, topology: Path = TOPOLOGY) -> set[int]:
    """The CPUs sharing `cpu`'s core (itself included), from /sys; just itself where /sys does not say."""
    path = topology / f"cpu{cpu}" / "topology" / "thread_siblings_list"
    try:
        return parse_cpu_list(path.read_text()) | {cpu}
    except (OSError, ValueError):
        return {cpu}


def parse_cpu_list(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def cores(cpus: set[int], topology: Path = TOPOLOGY) -> list[tuple[int, ...]]:
    """The usable CPUs grouped by physical core, in CPU order."""
    groups: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        group = tuple(sorted(siblings(cpu, topology) & cpus))
        seen.update(group)
        groups.append(group)
    return groups


def min_cores() -> int:
    return max(2, int(os.environ.get("TBENCH_PIN_MIN_CORES", MIN_CORES)))


def plan_placement(
    pin: bool = True,
    cpus: set[int] | None = None,
    topology: Path = TOPOLOGY,
    client_share: float = CLIENT_SHARE,
) -> Placement:
    """The server gets the first physical cores, the client the last `client_share` of them (at least one core);
    unpinned where asked, where fewer than `min_cores()` cores are usable, or where taskset is missing."""
    if not pin:
        return Placement(reason="not pinned: --no-pin-cpus")
    usable = set(os.sched_getaffinity(0) if cpus is None else cpus)
    groups = cores(usable, topology)
    if len(groups) < min_cores():
        return Placement(
            reason=f"not pinned: {len(usable)} usable CPU(s) on {len(groups)} core(s), fewer than {min_cores()} "
            "(one core's own unsteadiness would outweigh what pinning removes)"
        )
    if shutil.which("taskset") is None:
        return Placement(reason="not pinned: no taskset on this node (util-linux)")
    n_client = max(1, math.floor(len(groups) * client_share))
    server = tuple(c for g in groups[:-n_client] for c in g)
    client = tuple(c for g in groups[-n_client:] for c in g)
    return Placement(server, client, reason=f"server on {len(groups) - n_client} core(s), client on {n_client}")


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _set_affinity(tids: list[int], cpus: set[int]) -> dict[int, set[int]]:
    """Each thread's old affinity, for those it could be set on (a thread may end meanwhile)."""
    old = {}
    for tid in tids:
        try:
            before = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
            old[tid] = before
        except OSError:
            continue
    return old


@contextlib.contextmanager
def on_client_cpus(placement: Placement, exclude: list[psutil.Process] = ()) -> Iterator[None]:
    """This process's threads and its children (but the server's processes in `exclude`) on the client's CPUs while
    the block runs; what they had is restored after (a test process, or a flow that measures again, goes on as it
    was). New threads and children inherit the set from the thread that makes them."""
    if not placement.pinned:
        yield
        return
    skip = {p.pid for p in exclude}
    tids = _threads(os.getpid())
    for child in psutil.Process().children(recursive=True):
        if child.pid not in skip:
            tids += _threads(child.pid)
    old = _set_affinity(tids, set(placement.client))
    try:
        yield
    finally:
        for tid, cpus in old.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)
