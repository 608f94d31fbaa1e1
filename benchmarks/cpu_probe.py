"""How steady the CPU probe that every run takes (tbench.node.cpu_speed, the manifest's host.cpu_speed) is when the
machine is not changing, and so how far two runs' probes must differ before `tbench compare` and the history may say
the machine moved (MACHINE_MOVED):

1. **processes**: the probe in `--processes` fresh Python processes one after another on this idle machine (the spread
   a run's own process adds), beside the alternative it was chosen over (NumPy's exp over an L2-sized array).
2. **runs**: every ordered pair of runs within each set of runs in benchmarks/results/real_aa.json (one set: one
   model, one placement, minutes apart on an unchanged machine): how far their `best` readings differed, and how many
   pairs would have been said to be on a moved machine.

Usage: .venv/bin/python benchmarks/cpu_probe.py [--processes 16]
Writes benchmarks/results/cpu_probe.json with its provenance (benchmarks/provenance.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path

from provenance import RESULTS, recorded

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # standalone: the repository's tbench

from tbench.results.comparison import MACHINE_MOVED  # noqa: E402

READ_SIZES = ["resnet50 small", "tiny onnx"]  # the real_aa runs it reads
PROBES = r"""
import json, time
import numpy as np
from tbench.node.cpu_speed import cpu_speed

def numpy_exp(size=16_384, rounds=200, repeats=5):
    x = np.linspace(0.0, 1.0, size)
    out = np.empty_like(x)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(rounds):
            np.exp(x, out=out)
        best = min(best, time.perf_counter() - start)
    return size * rounds / best / 1e6

print(json.dumps({"loop": cpu_speed(), "numpy_exp": numpy_exp()}))
"""


def spread(values: list[float]) -> dict:
    return {
        "cv_pct": round(100 * statistics.stdev(values) / statistics.fmean(values), 2),
        "range": [round(min(values), 2), round(max(values), 2)],
    }


def pairs_within_sets(record: dict) -> dict:
    """Every ordered pair of ok runs within each set of the record: the relative difference of their best readings."""
    sets = {k: v for k, v in record.items() if k.startswith("runs_") and isinstance(v, list)}
    differences = []
    for runs in sets.values():
        best = [max(r["cpu_speed"].values()) for r in runs if r.get("ok") and r.get("cpu_speed")]
        differences += [abs(b / a - 1) for a, b in itertools.permutations(best, 2)]
    differences.sort()
    return {
        "source": "benchmarks/results/real_aa.json",
        "source_commit": record["provenance"]["commit"],
        "sets": sorted(sets),
        "pairs": len(differences),
        "median_pct": round(100 * statistics.median(differences), 2),
        "p90_pct": round(100 * differences[int(0.9 * len(differences))], 2),
        "max_pct": round(100 * differences[-1], 2),
        "machine_moved_pct": round(100 * MACHINE_MOVED, 2),
        "pairs_said_moved": sum(d > MACHINE_MOVED for d in differences),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=16)
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    with recorded(RESULTS / "cpu_probe.json", model_sizes=["no model: the CPU probe", *READ_SIZES]) as record:
        readings = []
        for i in range(args.processes):
            done = subprocess.run([sys.executable, "-c", PROBES], capture_output=True, text=True, check=True, cwd=root)
            readings.append(json.loads(done.stdout))
            print(f"process {i + 1}/{args.processes}: {readings[-1]}", flush=True)
        record["processes"] = {name: spread([r[name] for r in readings]) for name in ("loop", "numpy_exp")}
        record["processes"]["count"] = args.processes
        record["runs"] = pairs_within_sets(json.loads((RESULTS / "real_aa.json").read_text()))
        print(json.dumps({k: record[k] for k in ("processes", "runs")}), flush=True)


if __name__ == "__main__":
    main()
