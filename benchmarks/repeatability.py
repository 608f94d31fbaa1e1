"""Repeatability: the best throughput of one stable configuration, measured 3 times, for several measurement settings.

Each repetition starts a fresh embedded tritonserver (so the model load, the runtime's first calls and the server's
threads are part of what repeats) and runs the offline sweep; its best throughput is one sample. The coefficient of
variation (sample std / mean) over the repetitions is the figure; the goal is <= 5%. The settings differ in window size,
stability rule and the runtime's intra-op threads (on 2 cores, perf_analyzer and the server's own threads compete with
the runtime's), which is what they trade against time; each setting's wall time per sweep is reported beside it. By
default the sweep is the small model's best offline point only (batch 8), so more settings fit in a few minutes.

Usage: .venv/bin/python benchmarks/repeatability.py [--size small|full] [--repeats 3] [--batch-sizes 8]
Writes benchmarks/results/repeatability.json, whole, with its provenance (benchmarks/provenance.py); after every
setting an interim copy marked "complete": false, so an interrupted run keeps what it measured and says so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import model_adapters
from tasks.export import export_model
from tasks.perf import plan_points, run_sweep
from tasks.repository import ServingConfig, write_repository
from tasks.server import EmbeddedServer
from tbench.enums import Format, Scenario
from tbench.layout import RunLayout
from tbench.request import Measurement
from tbench.runtimes import source_digest

from provenance import RESULTS, Record, recorded

# name -> (perf_analyzer settings, the runtime's intra-op threads; 0 = all cores)
SETTINGS = {
    "cpu default: 24 inferences/window, 20%": (Measurement(), 0),
    "cpu default windows, 1 runtime thread": (Measurement(), 1),
    "1024/window, 10%": (Measurement(images_per_window=1024, stability_percentage=10, max_trials=8), 0),
    "4096/window, 10%": (Measurement(images_per_window=4096, stability_percentage=10, max_trials=8), 0),
    "16384/window, 10%": (Measurement(images_per_window=16384, stability_percentage=10, max_trials=8), 0),
    "65536/window, 10%": (Measurement(images_per_window=65536, stability_percentage=10, max_trials=8), 0),
}


def one_sweep(work: Path, tag: str, m: Measurement, batch_sizes: list[int], threads: int) -> tuple[float, float, int]:
    """A fresh server, the offline sweep, the best throughput; (best, seconds, stable points)."""
    layout = RunLayout(work, tag).create()
    write_repository(work / "repo", ServingConfig("resnet50", max(batch_sizes), [max(batch_sizes)], 0, 1,
                                                  intra_op_threads=threads), ARTIFACT)
    server = EmbeddedServer(work / "repo", layout.server_log)
    start = time.monotonic()
    server.start()
    try:
        table = run_sweep(plan_points([Scenario.OFFLINE], batch_sizes, []), model="resnet50", grpc_url=server.endpoints.grpc_url,
                          spec=ARTIFACT.io_spec, m=m, layout=layout, static={})
    finally:
        server.stop()
    ok = table[table["status"] == "ok"]
    return float(ok["throughput_infer_per_s"].max()), time.monotonic() - start, len(ok)


def measure(report: Record, work: Path, size: str, repeats: int, batch_sizes: list[int], threads: int) -> None:
    global ARTIFACT
    adapter = model_adapters.get("resnet50", size)
    module = adapter.build()
    ARTIFACT = export_model(adapter, module, Format.ONNX, work / "models", source_digest("pytorch", module))
    report.update({"model": f"resnet50 {size} onnx (python backend, embedded server)", "batch_sizes": batch_sizes,
                   "cores": threads, "settings": []})
    for k, (name, (m, runtime_threads)) in enumerate(SETTINGS.items()):
        runs = [one_sweep(work, f"setting{k}-run{i}", m, batch_sizes, runtime_threads or threads) for i in range(repeats)]
        best = [r[0] for r in runs if r[2]]  # a repetition without a stable point has no best; it is counted, not hidden
        cv = statistics.stdev(best) / statistics.mean(best) if len(best) > 1 else float("nan")
        row = {"setting": name, "measurement": m.model_dump(), "runtime_threads": runtime_threads or threads,
               "best_throughput": [round(r[0], 1) for r in runs], "cv_pct": round(100 * cv, 2),
               "seconds_per_sweep": round(statistics.mean(r[1] for r in runs), 1),
               "stable_points": [r[2] for r in runs], "meets_5pct": bool(cv <= 0.05) and len(best) == len(runs)}
        report["settings"].append(row)
        print(f"{name:45s} best {row['best_throughput']} infer/s  CV {row['cv_pct']:5.2f}%  "
              f"{row['seconds_per_sweep']:6.1f} s/sweep  stable {row['stable_points']}", flush=True)
        report.save()  # after every setting, so an interrupted run keeps what it measured ("complete": false)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="small")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-sizes", default="8")
    args = parser.parse_args()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    threads = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="tbench-repeat-"))
    with recorded(RESULTS / "repeatability.json", model_sizes=[f"resnet50 {args.size}"]) as report:
        measure(report, work, args.size, args.repeats, batch_sizes, threads)


if __name__ == "__main__":
    main()
