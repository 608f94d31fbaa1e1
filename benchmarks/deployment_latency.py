"""Trigger-to-running latency of a deployment run on the local stack.

Starts the local stack (Prefect server on SQLite, moto's S3 server, pools, deployments, a process worker for the
cpu pool polling every second), then submits a ResNet-50 run (`--size`, small by default) `--runs` times through the
API, one after the other, and times each from the API call to the RUNNING state (the worker's pickup, the process
start, the pull step) and to the end. Writes benchmarks/results/deployment_latency.json, whole, with its provenance
(benchmarks/provenance.py).

Usage: .venv/bin/python benchmarks/deployment_latency.py [--size small] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from provenance import RESULTS, recorded

from tbench.team.stack import Stack

PARAMETERS = {
    "request": {
        "model": "resnet50",
        "size": "small",
        "formats": ["onnx"],
        "batch_sizes": [1, 4],
        "concurrency": [2],
        "measurement": {"stability_percentage": 50},
    }
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", default=PARAMETERS["request"]["size"], help="the ResNet-50 size each run benchmarks")
    args = parser.parse_args()
    parameters = {"request": {**PARAMETERS["request"], "size": args.size}}
    with recorded(RESULTS / "deployment_latency.json", model_sizes=[f"resnet50 {args.size}"]) as record:
        record.update(measure(args.runs, parameters))


def measure(n_runs: int, parameters: dict) -> dict:
    stack = Stack(root=Path(tempfile.mkdtemp(prefix="tbench-stack-")))
    t0 = time.monotonic()
    stack.up()
    up_s = time.monotonic() - t0
    os.environ.update(stack.client_env())
    from tbench.team.submit import follow, submit

    runs = []
    try:
        for i in range(n_runs):
            started = time.monotonic()
            run_id = submit("triton-benchmark/benchmark-cpu", parameters)
            result = follow(run_id, lambda line: None, timeout_s=900, poll_s=0.2, submitted_at=started)
            runs.append(
                {
                    "state": result.state,
                    "to_running_s": round(result.seconds_to_running, 2),
                    "total_s": round(time.monotonic() - started, 1),
                }
            )
            print(
                f"run {i + 1}: {result.state}, running after {result.seconds_to_running:.2f} s, "
                f"done after {runs[-1]['total_s']:.1f} s",
                flush=True,
            )
    finally:
        stack.down()
    to_running = [r["to_running_s"] for r in runs]
    out = {
        "parameters": parameters,
        "stack_up_s": round(up_s, 1),
        "worker_poll_s": 1,
        "runs": runs,
        "to_running_median_s": statistics.median(to_running),
        "to_running_max_s": max(to_running),
    }
    print(
        f"stack up in {up_s:.1f} s; trigger to running: median {out['to_running_median_s']:.2f} s, "
        f"max {out['to_running_max_s']:.2f} s over {len(runs)} runs"
    )
    return out


if __name__ == "__main__":
    main()
