"""How steady the CPU probe that every run takes (tbench.node.cpu_speed, the manifest's host.cpu_speed) is when the
machine is not changing, and so how far two runs' probes must differ before `tbench compare` and the history may say
the machine moved (MACHINE_MOVED):

1. **processes**: the probe in `--processes` fresh Python processes one after another on this idle machine (the spread
   a run's own process adds), beside the alternative it was chosen over (NumPy's exp over an L2-sized array).
2. **runs**: every ordered pair of runs within each set of runs in benchmarks/results/real_aa.json (one set: one
   model, one placement, minutes apart on an unchanged machine): how far their `best` readings differed, and how many
   pairs would have been said to be on a moved machine.
3. **tracking**: whether a model's throughput follows the probe: every ordered pair of one model's repeated runs in
   benchmarks/results/default_runs.json (fresh servers one after another), the probe's change beside the best
   throughput's; the pairs said to be on a moved machine whose throughput moved less than half as far (the message
   warned of a move the model did not show), and the pairs whose throughput moved beyond MACHINE_MOVED while the probe
   did not (a move it missed); with real_aa.json's correlation of the two per set (`machine_speed`).

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

READ_SIZES = ["resnet50 small", "tiny onnx", "tiny file", "resnet50 full"]  # the real_aa and default_runs runs it reads
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


def tracking(default_runs: dict, real_aa: dict) -> dict:
    """Each ordered pair of one model's repeated runs: how far the probe's best reading moved beside its best
    throughput (relative changes, %), and where the two disagreed."""
    pairs = []
    for model in default_runs["models"]:
        runs = [r for r in model["runs"] if r.get("status") == "completed" and r.get("cpu_speed")]
        for a, b in itertools.permutations(runs, 2):
            probe = max(b["cpu_speed"].values()) / max(a["cpu_speed"].values()) - 1
            throughput = b["best_throughput"] / a["best_throughput"] - 1
            pairs.append(
                {
                    "model_size": model["model_size"],
                    "probe_pct": round(100 * probe, 2),
                    "best_throughput_pct": round(100 * throughput, 2),
                }
            )
    said = [p for p in pairs if abs(p["probe_pct"]) > 100 * MACHINE_MOVED]
    return {
        "source": "benchmarks/results/default_runs.json",
        "source_commit": default_runs["provenance"]["commit"],
        "pairs": pairs,
        "pairs_said_moved": len(said),
        "said_moved_model_did_not_follow": sum(
            p["best_throughput_pct"] * p["probe_pct"] <= 0 or abs(p["best_throughput_pct"]) < abs(p["probe_pct"]) / 2
            for p in said
        ),
        "model_moved_probe_did_not": sum(
            abs(p["best_throughput_pct"]) > 100 * MACHINE_MOVED and abs(p["probe_pct"]) <= 100 * MACHINE_MOVED
            for p in pairs
        ),
        "real_aa_r_probe_best_throughput": {
            name: s["r_probe_best_throughput"] for name, s in real_aa.get("machine_speed", {}).items()
        },
        "real_aa_commit": real_aa["provenance"]["commit"],
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
        real_aa = json.loads((RESULTS / "real_aa.json").read_text())
        record["runs"] = pairs_within_sets(real_aa)
        record["tracking"] = tracking(json.loads((RESULTS / "default_runs.json").read_text()), real_aa)
        print(json.dumps({k: record[k] for k in ("processes", "runs", "tracking")}), flush=True)


if __name__ == "__main__":
    main()
