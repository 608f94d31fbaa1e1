"""Wall time of the README's main job and the share of the flow spent in perf_analyzer measurement.

Runs `tbench run resnet50 --size SIZE` (the main job's command, after set-up; the main job's size is full) and reads
the run's manifest. Writes benchmarks/results/main_job.json, whole, with its provenance (benchmarks/provenance.py).
Usage: .venv/bin/python benchmarks/main_job.py [--size full] [--repeat 1] [extra tbench args...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import RESULTS, Record, recorded


def measure(record: Record, size: str, repeat: int, extra: list[str]) -> None:
    tbench = Path(sys.executable).with_name("tbench")
    record.update({"size": size, "extra_args": extra, "runs": []})
    for i in range(repeat):
        out = tempfile.mkdtemp(prefix="tbench-main-")
        start = time.monotonic()
        done = subprocess.run([str(tbench), "run", "resnet50", "--size", size, "--output", out, *extra],
                              capture_output=True, text=True)
        wall = time.monotonic() - start
        if done.returncode != 0:
            sys.exit(f"main job failed: {done.stderr.strip().splitlines()[-1:]}")
        run_dir = Path(done.stdout.strip().splitlines()[-1])
        m = json.loads((run_dir / "manifest.json").read_text())
        flow = (dt.datetime.fromisoformat(m["finished_at"]) - dt.datetime.fromisoformat(m["started_at"])).total_seconds()
        perf = sum(s["seconds"] for name, s in m["stages"].items() if name.startswith("perf-"))
        request = m.get("request") or {}
        measured = f"{request.get('model', 'resnet50')} {request.get('size') or size}"
        if measured not in record.model_sizes:
            record.model_sizes.append(measured)
        record["runs"].append({"run_dir": str(run_dir), "model_size": measured, "wall_s": round(wall, 1),
                               "flow_s": round(flow, 1), "perf_analyzer_s": round(perf, 1),
                               "perf_share_pct": round(100 * perf / flow, 1), "points_ok": m["summary"]["points_ok"],
                               "points": m["summary"]["points"],
                               "stages_s": {k: v["seconds"] for k, v in m["stages"].items()}})
        print(f"run {i + 1}: wall {wall:.1f} s (goal <= 180), flow {flow:.1f} s, perf_analyzer {perf:.1f} s = "
              f"{100 * perf / flow:.0f}% of the flow (goal >= 60%), {m['summary']['points_ok']}/{m['summary']['points']} "
              f"points stable, stages: " + ", ".join(f"{k} {v['seconds']:.1f}" for k, v in m["stages"].items()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="full", help="the ResNet-50 size (the main job, scripts/run.sh, runs full)")
    parser.add_argument("--repeat", type=int, default=1)
    args, extra = parser.parse_known_args()
    # model_sizes: "MODEL SIZE" as each run's manifest resolved it, added as the run ends
    with recorded(RESULTS / "main_job.json") as record:
        measure(record, args.size, args.repeat, extra)


if __name__ == "__main__":
    main()
