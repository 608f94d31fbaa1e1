"""Run submissions the way the Prefect UI sends them (one POST, no retry) to the local stack's server, on SQLite.

For each server (`patched`: the stack's `tbench.team.prefect_server`, whose SQLite transactions begin IMMEDIATE;
`as-shipped`: plain `prefect server start`), brings up the local stack with the cpu pool and its worker (polling every
second), keeps one core busy (a loop pinned to CPU 0, as another process on a shared machine), and POSTs
`--submissions` create_flow_run calls for the capacity deployment, scheduled a month ahead so that the worker leaves
them. Counts the answers by status and the retryable errors (SQLite "database is locked") the server logged for any
request, the worker's included. Writes benchmarks/results/ui_submissions.json with its provenance.

Usage: .venv/bin/python benchmarks/ui_submissions.py [--submissions 150]
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from provenance import RESULTS, recorded

from tbench.team import prefect_server, stack

DEPLOYMENT = "triton-capacity/capacity-cpu"
PARAMETERS = {"request": {"model": "resnet50", "size": "small"}, "capacity": {"slo_ms": 200, "traffic_rps": 20}}


PATCHED = prefect_server.argv


def as_shipped(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("prefect")), *args]


def measure(server: str, submissions: int) -> dict:
    os.environ["PREFECT_SERVER_LOG_RETRYABLE_ERRORS"] = "true"  # the server's environment: its log names each one
    prefect_server.argv = PATCHED if server == "patched" else as_shipped  # what Stack.start_server calls
    s = stack.Stack(root=Path(tempfile.mkdtemp(prefix=f"tbench-ui-{server}-")), pools=("cpu",))
    s.up()
    busy = subprocess.Popen(["taskset", "-c", "0", "sh", "-c", "while :; do :; done"])
    try:
        deployment = httpx.get(f"{s.api_url}/deployments/name/{DEPLOYMENT}").json()
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=30)
        body = {
            "parameters": PARAMETERS,
            "state": {"type": "SCHEDULED", "state_details": {"scheduled_time": later.isoformat()}},
        }
        statuses: Counter = Counter()
        seconds = []
        for _ in range(submissions):
            t0 = time.monotonic()
            answer = httpx.post(f"{s.api_url}/deployments/{deployment['id']}/create_flow_run", json=body, timeout=120)
            seconds.append(time.monotonic() - t0)
            statuses[answer.status_code] += 1
    finally:
        busy.kill()
        s.down()
    log = (s.root / "prefect-server.log").read_text()
    return {
        "submissions": submissions,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "failed": submissions - statuses[201],
        "failed_share": round((submissions - statuses[201]) / submissions, 4),
        "retryable_errors_logged": log.count("Encountered retryable exception"),
        "slowest_s": round(max(seconds), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--submissions", type=int, default=150)
    args = parser.parse_args()
    with recorded(RESULTS / "ui_submissions.json", model_sizes=["no model: run submissions only"]) as record:
        record["conditions"] = (
            "local stack (SQLite), cpu pool worker polling every 1 s, one core busy; create_flow_run POSTed one at a "
            "time without retries, as the UI's Submit"
        )
        record["servers"] = {}
        for server in ("as-shipped", "patched"):
            record["servers"][server] = measure(server, args.submissions)
            print(server, record["servers"][server], flush=True)


if __name__ == "__main__":
    main()
