"""Wall time of the README's main job and the share of the flow spent in perf_analyzer measurement.

Runs `tbench run resnet50` (the main job's command, after set-up) and reads the run's manifest.
Usage: .venv/bin/python benchmarks/main_job.py [--repeat 1] [extra tbench args...]
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=1)
    args, extra = parser.parse_known_args()
    tbench = Path(sys.executable).with_name("tbench")
    for i in range(args.repeat):
        out = tempfile.mkdtemp(prefix="tbench-main-")
        start = time.monotonic()
        done = subprocess.run([str(tbench), "run", "resnet50", "--output", out, *extra], capture_output=True, text=True)
        wall = time.monotonic() - start
        if done.returncode != 0:
            sys.exit(f"main job failed: {done.stderr.strip().splitlines()[-1:]}")
        run_dir = Path(done.stdout.strip().splitlines()[-1])
        m = json.loads((run_dir / "manifest.json").read_text())
        flow = (dt.datetime.fromisoformat(m["finished_at"]) - dt.datetime.fromisoformat(m["started_at"])).total_seconds()
        perf = sum(s["seconds"] for name, s in m["stages"].items() if name.startswith("perf-"))
        print(f"run {i + 1}: wall {wall:.1f} s (goal <= 180), flow {flow:.1f} s, perf_analyzer {perf:.1f} s = "
              f"{100 * perf / flow:.0f}% of the flow (goal >= 60%), {m['summary']['points_ok']}/{m['summary']['points']} "
              f"points stable, stages: " + ", ".join(f"{k} {v['seconds']:.1f}" for k, v in m["stages"].items()))


if __name__ == "__main__":
    main()
