"""How fast this machine's CPU runs a fixed piece of work, read just before and just after a run's sweeps (the
manifest's host.cpu_speed). A machine that sped up or slowed down between two runs (a VM restored from a snapshot
warming up, the hypervisor's other guests, frequency scaling) may move every figure of the run alike: `tbench compare`
says where two runs' probes differ (tbench.results.compare), as a fact about the machine, not a share of the change.

The work is a pure-Python loop on one core, best of a few repeats (the least disturbed one): it needs no library and
almost no memory, so it reads the core's speed, not a neighbour's burst or the caches. ~25 ms in all. A run keeps the
better of its two readings (`best`: whatever else runs can only slow a reading, never speed it up). On a steady 2-core
VM two runs' `best` differed by 1.58-4.04% in the median and 7.48-17.51% at most (102 pairs of runs, three records);
in 16 fresh processes the loop spread by 1.55-3.9%, NumPy's exp over an L2-sized array by 2.65-5.02%, no steadier, and
the loop needs no library.
A model's throughput does not follow it: of a model's repeated runs (the record at 527e6f9), the 2 pairs whose probes
were over 10% apart served within 0.39% of each other, and 4 pairs whose probes stayed within 3.13% served
11.38-18.34% apart (benchmarks/results/cpu_probe.json and its history).
"""

from __future__ import annotations

import time

STEPS = 200_000  # ~10 ms a repeat on a 2020s core: long against the clock's resolution, short against the run
REPEATS = 5


def cpu_speed(steps: int = STEPS, repeats: int = REPEATS) -> float:
    """Millions of loop steps a second, the best of `repeats`."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        total = 0
        for i in range(steps):
            total += i
        best = min(best, time.perf_counter() - start)
    return round(steps / best / 1e6, 2)
