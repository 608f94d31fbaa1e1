"""`tbench compare`'s verdict against a latency change we planted, and against none: the sleeper of
benchmarks/capacity_truth.py (a python-backend model with a fixed service time, one instance) measured at the same
offered Poisson rate, the measurement a run makes of a rate point (`tbench.stages.sweep.run_sweep`, default windows).

- a baseline run at the base service time;
- `--repeats` unchanged runs (same service time, same rate), each judged against the baseline: the verdict must be
  "no significant change" (a false regression here would fail a CI gate for nothing);
- one planted run with a longer service time at the same rate: throughput equals the offered rate (the server keeps
  up) while latency rises; the verdict must be "regression" with a non-zero exit code;
- a rate point at 10 req/s on the sleeper at 1 ms: it completes in its windows' time, not a timeout.

Each judgement is the real command a CI job runs: `tbench compare BASELINE CANDIDATE`, its exit code recorded.

Usage: .venv/bin/python benchmarks/latency_verdict.py [--service-ms 10] [--planted-ms 15] [--rate 40] [--repeats 10]
Writes benchmarks/results/latency_verdict.json, whole, with its provenance (benchmarks/provenance.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from provenance import RESULTS, recorded

from tbench.core.enums import Scenario
from tbench.core.layout import RunLayout
from tbench.loadgen.perf_analyzer import PerfInputs
from tbench.request.benchmark import Measurement
from tbench.results.compare import EXIT_CODES, REGRESSION
from tbench.stages.sweep import plan_points, run_sweep
from tbench.triton.process_server import EmbeddedServer
from tbench.triton.sleeper import MODEL, SPEC, sleeper_repository

TBENCH = str(Path(sys.executable).with_name("tbench"))
STATIC = {"model": MODEL, "model_size": "sleeper", "format": "python", "precision": "FP32", "gpu": "CPU"}


def measured_run(work: Path, name: str, service_ms: float, rate: float) -> Path:
    """One run folder (results.parquet + perf_analyzer logs) of the sleeper at `service_ms`, one Poisson rate point."""
    repo = sleeper_repository(work / f"repo_{name}", service_ms)
    layout = RunLayout(work, name).create()
    with EmbeddedServer(repo, work / f"server_{name}.log") as server:
        table = run_sweep(
            plan_points([Scenario.RATE], [], [], rates=[rate], distribution="poisson"),
            model=MODEL,
            grpc_url=server.endpoints.grpc_url,
            spec=SPEC,
            m=Measurement(),
            layout=layout,
            static=STATIC,
            inputs=PerfInputs(shared_memory="none"),
        )
    table.to_parquet(layout.run_dir / "results.parquet")
    return layout.run_dir


def low_rate_point(work: Path) -> dict:
    """A rate point at 10 req/s on a 1 ms model: its windows hold window_s of arrivals (not window_s / latency, which
    asked for 2,000 requests a window and timed out after 300 s); how long it took, and whether it kept up."""
    import pandas as pd

    run_dir = measured_run(work, "low_rate", 1.0, 10.0)
    row = pd.read_parquet(run_dir / "results.parquet").iloc[0]
    return {
        "service_ms": 1.0,
        "rate": 10.0,
        "status": row["status"],
        "error": row["error"],
        "measurement_request_count": int(row["measurement_request_count"]),
        "window_s": round(float(row["window_s"]), 2),
        "measure_seconds": round(float(row["measure_seconds"]), 1),
        "throughput_infer_per_s": round(float(row["throughput_infer_per_s"]), 3),
    }


def compare(baseline: Path, candidate: Path, out: Path) -> dict:
    done = subprocess.run(
        [TBENCH, "compare", str(baseline), str(candidate), "--output", str(out)], capture_output=True, text=True
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    return {"exit_code": done.returncode, "summary": lines[0] if lines else done.stderr.strip()[-300:]}


def point(run_dir: Path) -> dict:
    import pandas as pd

    row = pd.read_parquet(run_dir / "results.parquet").iloc[0]
    return {k: (None if pd.isna(row[k]) else row[k]) for k in ("status", "throughput_infer_per_s", "p99_ms", "avg_ms")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-ms", type=float, default=10.0)
    parser.add_argument("--planted-ms", type=float, default=15.0)
    parser.add_argument("--rate", type=float, default=40.0, help="offered requests/s, the same for every run")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    with (
        recorded(RESULTS / "latency_verdict.json", model_sizes=[f"sleeper {args.service_ms:g}ms"]) as record,
        tempfile.TemporaryDirectory(prefix="latency-verdict-") as tmp,
    ):
        work = Path(tmp)
        record["settings"] = vars(args) | {"measurement": Measurement().model_dump()}
        baseline = measured_run(work, "baseline", args.service_ms, args.rate)
        record["baseline"] = point(baseline)
        record["unchanged"] = []
        for i in range(args.repeats):
            run = measured_run(work, f"repeat{i}", args.service_ms, args.rate)
            record["unchanged"].append(point(run) | compare(baseline, run, work / f"cmp{i}"))
            record.save()
            print(f"unchanged {i}: {record['unchanged'][-1]}", flush=True)
        planted = measured_run(work, "planted", args.planted_ms, args.rate)
        record["planted"] = point(planted) | compare(baseline, planted, work / "cmp_planted")
        print(f"planted: {record['planted']}", flush=True)
        false_alarms = [r for r in record["unchanged"] if r["exit_code"] != 0]
        record["false_regressions"] = len(false_alarms)
        record["low_rate"] = low_rate_point(work)
        print(f"low rate: {record['low_rate']}", flush=True)
        record["planted_caught"] = record["planted"]["exit_code"] == EXIT_CODES[REGRESSION]  # the gate's own code


if __name__ == "__main__":
    main()
