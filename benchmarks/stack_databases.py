"""The local stack on SQLite beside the same stack on PostgreSQL: start-up and deployment runs, timed alike.

For each database: `Stack.up()` (Prefect server, moto's S3 server, pools, deployments, the cpu pool's process worker),
then `--runs` small ResNet-50 runs submitted through the API one after the other, each timed from the API call to
RUNNING and to the end, then `down()`. PostgreSQL is a throwaway cluster started as the tests start it
(tests/services.py: Debian's server binaries, as root through the postgres user). Writes
benchmarks/results/stack_databases.json, whole, with its provenance.

Usage: .venv/bin/python benchmarks/stack_databases.py [--size small] [--runs 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from provenance import RESULTS, recorded

from tbench.team.stack import Stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from services import postgres_server  # noqa: E402  (the tests' way of starting PostgreSQL)

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


def one_stack(database_url: str | None, n_runs: int, parameters: dict) -> dict:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tbench.team.submit import follow, submit

    stack = Stack(root=Path(tempfile.mkdtemp(prefix="tbench-stack-")), database_url=database_url)
    t0 = time.monotonic()
    stack.up()
    up_s = time.monotonic() - t0
    runs = []
    saved = dict(os.environ)
    os.environ.update(stack.client_env())  # S3 and the artifact root, as a shell with `tbench stack env` has them
    try:
        # Prefect reads the environment once, at import: each stack's API is set explicitly (the second one too)
        with temporary_settings(updates={PREFECT_API_URL: stack.api_url}):
            for _ in range(n_runs):
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
    finally:
        os.environ.clear()
        os.environ.update(saved)
        t1 = time.monotonic()
        stack.down()
        down_s = time.monotonic() - t1
    return {
        "stack_up_s": round(up_s, 1),
        "stack_down_s": round(down_s, 1),
        "runs": runs,
        "to_running_median_s": statistics.median(r["to_running_s"] for r in runs),
        "total_median_s": statistics.median(r["total_s"] for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--size", default="small", help="the ResNet-50 size each run benchmarks")
    args = parser.parse_args()
    parameters = {"request": {**PARAMETERS["request"], "size": args.size}}
    with recorded(RESULTS / "stack_databases.json", model_sizes=[f"resnet50 {args.size}"]) as record:
        out = {"parameters": parameters, "sqlite": one_stack(None, args.runs, parameters)}
        with postgres_server() as url:
            out["postgresql"] = one_stack(url, args.runs, parameters)
        for key in ("stack_up_s", "total_median_s"):
            out[f"{key}_ratio_postgresql_to_sqlite"] = round(out["postgresql"][key] / out["sqlite"][key], 2)
        record.update(out)
        for db in ("sqlite", "postgresql"):
            r = out[db]
            print(
                f"{db}: up {r['stack_up_s']} s, trigger to running {r['to_running_median_s']} s, "
                f"run {r['total_median_s']} s (median of {len(r['runs'])})"
            )


if __name__ == "__main__":
    main()
