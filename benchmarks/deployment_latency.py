"""Trigger-to-running latency of a deployment run on the local stack.

Starts the local stack (Prefect server on SQLite, moto's S3 server, pools, deployments, a process worker for the
cpu pool polling every second), then submits the small ResNet-50 run `--runs` times through the API, one after the
other, and times each from the API call to the RUNNING state (the worker's pickup, the process start, the pull step)
and to the end. Writes benchmarks/results/deployment_latency.json.

Usage: .venv/bin/python benchmarks/deployment_latency.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from tbench.stack import Stack

PARAMETERS = {"request": {"model": "resnet50", "size": "small", "formats": ["onnx"], "batch_sizes": [1, 4],
                          "concurrency": [2], "measurement": {"images_per_window": 16}}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    stack = Stack(root=Path(tempfile.mkdtemp(prefix="tbench-stack-")))
    t0 = time.monotonic()
    stack.up()
    up_s = time.monotonic() - t0
    os.environ.update(stack.client_env())
    from tbench.submit import follow, submit

    runs = []
    try:
        for i in range(args.runs):
            started = time.monotonic()
            run_id = submit("triton-benchmark/benchmark-cpu", PARAMETERS)
            result = follow(run_id, lambda line: None, timeout_s=900, poll_s=0.2, submitted_at=started)
            runs.append({"state": result.state, "to_running_s": round(result.seconds_to_running, 2),
                         "total_s": round(time.monotonic() - started, 1)})
            print(f"run {i + 1}: {result.state}, running after {result.seconds_to_running:.2f} s, "
                  f"done after {runs[-1]['total_s']:.1f} s", flush=True)
    finally:
        stack.down()
    to_running = [r["to_running_s"] for r in runs]
    out = {"stack_up_s": round(up_s, 1), "worker_poll_s": 1, "runs": runs,
           "to_running_median_s": statistics.median(to_running), "to_running_max_s": max(to_running)}
    print(f"stack up in {up_s:.1f} s; trigger to running: median {out['to_running_median_s']:.2f} s, "
          f"max {out['to_running_max_s']:.2f} s over {len(runs)} runs")
    path = Path(__file__).parent / "results" / "deployment_latency.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"written {path}")


if __name__ == "__main__":
    main()
