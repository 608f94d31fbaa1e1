"""How steady this machine is, apart from anything tbench does: a fixed piece of CPU work (a pure-Python loop, and a
NumPy matrix product) timed again and again on each core, with nothing else of ours running. The spread of those
timings is a floor under the run-to-run spread of any benchmark on the machine (issue 34's stability goal: best
throughput's CV over 3 runs <= 1.5%): a machine whose fixed work varies by more cannot show a model's throughput
steadier than that. Also the CPU time the hypervisor took from this machine over the span (/proc/stat's steal).

Usage: .venv/bin/python benchmarks/machine_noise.py [--seconds 60]
Writes benchmarks/results/machine_noise.json, whole, with its provenance (benchmarks/provenance.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# one BLAS thread, set before NumPy loads it: a pinned process's product then runs on its core only (affinity is the
# calling thread's, and threads made at import keep both cores)
os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"

import numpy as np  # noqa: E402
from provenance import RESULTS, recorded


def python_loop() -> None:
    total = 0
    for i in range(3_000_000):
        total += i * i


MATRIX = np.random.default_rng(0).standard_normal((256, 256))


def matmul() -> None:
    for _ in range(60):
        MATRIX @ MATRIX


def cpu_times() -> tuple[int, int]:
    """(all jiffies, stolen jiffies) of the machine so far."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return sum(fields), fields[7] if len(fields) > 7 else 0


BLOCK_S = 2.0  # a measurement window's length by default (tbench.request.benchmark.Measurement.window_s)


def cv(values: list[float]) -> float:
    return round(100 * statistics.stdev(values) / statistics.mean(values), 2)


def spread(timings: list[float]) -> dict:
    """The timings' spread, and that of the work done per BLOCK_S (consecutive timings summed): a window's throughput
    averages over its span, so a spread of single short timings overstates what a window sees."""
    per_block = max(1, round(BLOCK_S / statistics.mean(timings)))
    blocks = [per_block / sum(timings[i : i + per_block]) for i in range(0, len(timings) - per_block + 1, per_block)]
    return {
        "repeats": len(timings),
        "mean_ms": round(1000 * statistics.mean(timings), 2),
        "min_ms": round(1000 * min(timings), 2),
        "max_ms": round(1000 * max(timings), 2),
        "cv_pct": cv(timings),
        "max_over_min": round(max(timings) / min(timings), 3),
        f"blocks_of_{BLOCK_S:g}s": len(blocks),
        "block_rate_cv_pct": cv(blocks) if len(blocks) > 1 else None,
    }


def timed(work, seconds: float) -> list[float]:
    timings, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        work()
        timings.append(time.perf_counter() - start)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0, help="time spent per work and core")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    with recorded(RESULTS / "machine_noise.json", model_sizes=["no model: fixed CPU work"]) as record:
        total0, steal0 = cpu_times()
        record["by_core"] = {}
        for core in cores:
            os.sched_setaffinity(0, {core})
            record["by_core"][str(core)] = {
                "python_loop": spread(timed(python_loop, args.seconds / 2)),
                "numpy_matmul": spread(timed(matmul, args.seconds / 2)),
            }
        os.sched_setaffinity(0, set(cores))
        total1, steal1 = cpu_times()
        record["steal_pct"] = round(100 * (steal1 - steal0) / max(total1 - total0, 1), 3)
        # the goal is a CV of whole runs' best throughput: a window-long block's is the closest this can say
        worst = max(w["block_rate_cv_pct"] or 0.0 for c in record["by_core"].values() for w in c.values())
        record["worst_block_rate_cv_pct"] = worst
        record["stability_goal_cv_pct"] = 1.5
        record["below_goal"] = worst <= 1.5
        for core, works in record["by_core"].items():
            for name, s in works.items():
                print(
                    f"core {core} {name}: CV {s['cv_pct']}% over {s['repeats']} timings, max/min {s['max_over_min']}; "
                    f"per {BLOCK_S:g} s: CV {s['block_rate_cv_pct']}%"
                )
        print(f"steal {record['steal_pct']}%")


if __name__ == "__main__":
    main()
