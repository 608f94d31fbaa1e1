"""The history on real runs and at scale.

Part `real`: a history of real runs of one model on this machine with one planted change. `--runs` runs of the tiny
image model (benchmarks/tiny_model.py, a file we did not write) go into one artifact root, each a `tbench run` of its
own; from run `--change-at` on, the run is pinned to one CPU (`taskset -c 0`: server, perf_analyzer and all), as a
worker that lost cores would be. Then `tbench history` judges the root: the planted change must be found at the right
run in the series it moved and put down to "CPUs the worker may use: 2 → 1", and nothing flagged before it.

Part `refresh`: the time to judge and write the site for 1,000 runs of history (synthetic stored runs of one model,
8 points each, written as the store writes them: the results dataset plus a manifest per run).

Usage: .venv/bin/python benchmarks/history.py [--part real|refresh|all] [--runs 10] [--change-at 6] [--plan tiny]
Writes benchmarks/results/history.json with its provenance (benchmarks/provenance.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from provenance import RESULTS, recorded
from tiny_model import build_tiny_image_onnx

GRID = ["--batch-sizes", "1,4", "--concurrency", "2,4"]


def real_history(record, runs: int, change_at: int, plan: str) -> None:
    from tbench.history.analysis import analyse

    work = Path(tempfile.mkdtemp(prefix="tbench-history-real-"))
    model = build_tiny_image_onnx(work / "tiny.onnx") if plan == "tiny" else Path(plan).resolve()
    root = work / "artifacts"
    tbench = str(Path(sys.executable).with_name("tbench"))
    walls, run_ids = [], []
    for i in range(runs):
        pinned = i >= change_at
        argv = (["taskset", "-c", "0"] if pinned else []) + [tbench, "run", "--model-file", str(model), *GRID]
        started = time.monotonic()
        done = subprocess.run([*argv, "--output", str(root)], capture_output=True, text=True)
        walls.append(round(time.monotonic() - started, 1))
        print(f"run {i + 1}/{runs}{' pinned to cpu 0' if pinned else ''}: exit {done.returncode}", flush=True)
        if done.returncode not in (0, 3):
            raise SystemExit(f"run {i + 1} failed: {done.stderr.strip().splitlines()[-1:]}")
        run_ids.append(Path(done.stdout.strip().splitlines()[-1]).name)
    started = time.monotonic()
    history = analyse(str(root))
    judged_s = time.monotonic() - started
    moved, flagged_before, right = [], [], []
    for f in history.findings:
        if f.candidate:
            continue
        # by run, not by position: a series misses the runs whose point was not stable
        at_run = run_ids.index(f.run_after) + 1
        entry = {"series": f.series.name, "at_run": at_run, "relative": round(f.change.relative, 4)}
        entry["differences"] = [d.line() for d in f.differences]
        (moved if at_run == change_at + 1 else flagged_before).append(entry)
        if at_run == change_at + 1 and "CPUs the worker may use: 2 → 1" in entry["differences"]:
            right.append(f.series.name)
    record["real"] = {
        "runs": runs,
        "change_at_run": change_at + 1,
        "planted": "runs pinned to one CPU (taskset -c 0) from change_at_run on",
        "grid": " ".join(GRID),
        "series": len(history.series),
        "changes_at_the_planted_run": moved,
        "attributed_to_the_cpus": len(right),
        "changes_elsewhere": flagged_before,
        "verdict": history.verdict,
        "run_wall_s": walls,
        "judge_s": round(judged_s, 2),
    }


def synthetic_run(root: Path, night: int, rng) -> None:
    from tbench.core.metrics import RESULT_COLUMNS
    from tbench.results.dataset import add_run_to_dataset

    started = dt.datetime(2024, 1, 1, 2, tzinfo=dt.UTC) + dt.timedelta(days=night)
    run_id = f"tiny-{started:%Y%m%d-%H%M%S}-{night:06x}"
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    rows = []
    for scenario, batch, concurrency in [("offline", b, 1) for b in (1, 2, 4, 8)] + [
        ("online", 1, c) for c in (1, 2, 4, 8)
    ]:
        row = {c: np.nan for c in RESULT_COLUMNS}
        throughput = 1000 * batch * concurrency**0.5 * (1 + rng.normal(0, 0.02))
        row.update(model="tiny", model_size="file", gpu="CPU", format="onnx", precision="fp32", scenario=scenario)
        row.update(batch_size=batch, concurrency=concurrency, status="ok", throughput_infer_per_s=throughput)
        row.update(p50_ms=batch * 1000 / throughput, p99_ms=1.5 * batch * 1000 / throughput)
        row.update(throughput_cv=0.03, latency_cv=0.03)
        rows.append(row)
    pd.DataFrame(rows).to_parquet(run_dir / "results.parquet")
    manifest = {
        "run_id": run_id,
        "status": "completed",
        "started_at": started.isoformat(),
        "request": {"model": "tiny"},
    }
    text = json.dumps(manifest)  # the run's manifest: an input of the benchmark, not its result
    (run_dir / "manifest.json").write_text(text)
    add_run_to_dataset(run_dir, str(root), run_id, "completed")


def refresh_time(record, runs: int = 1000) -> None:
    from tbench.history.analysis import analyse
    from tbench.history.site import write_site

    root = Path(tempfile.mkdtemp(prefix="tbench-history-refresh-"))
    rng = np.random.default_rng(0)
    for night in range(runs):
        synthetic_run(root, night, rng)
    started = time.monotonic()
    history = analyse(str(root))
    judged = time.monotonic() - started
    write_site(history, root / "site")
    total = time.monotonic() - started
    record["refresh"] = {
        "runs": runs,
        "series": len(history.series),
        "points_per_run": 8,
        "judge_s": round(judged, 1),
        "site_s": round(total - judged, 1),
        "refresh_s": round(total, 1),
        "cpus": len(os.sched_getaffinity(0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", default="all", choices=("real", "refresh", "all"))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--change-at", type=int, default=6, help="the first pinned run, counted from 0")
    parser.add_argument("--plan", default="tiny", help="real part: 'tiny' (the tiny image model) or an ONNX file")
    args = parser.parse_args()
    with recorded(RESULTS / "history.json", model_sizes=[f"{Path(args.plan).stem} file"]) as record:
        if args.part in ("refresh", "all"):
            refresh_time(record)
            print(json.dumps(record["refresh"]), flush=True)
            record.save()
        if args.part in ("real", "all"):
            real_history(record, args.runs, args.change_at, args.plan)
            print(json.dumps(record["real"], indent=1), flush=True)


if __name__ == "__main__":
    main()
