"""Default runs as a user starts them: wall time, perf_analyzer's share of it, stability, offline queue time,
throughput against batch size, and repeatability (best throughput over repeated runs, each on a fresh server).

Each entry of --plan is `MODEL[:SIZE]=REPEATS`; MODEL is a registered adapter or `tiny`, the tiny image ONNX model of
benchmarks/tiny_model.py run through `--model-file` (a fast model we did not write). Every run is `tbench run MODEL
[--size SIZE]` with nothing else, i.e. the model's default CPU profile, in a subprocess (its own server).

Goals checked per run: wall <= 180 s, perf_analyzer >= 60% of the flow, every point stable, offline batch-1 server
queue <= 0.1 ms, offline throughput never falling as the batch grows; per model with repeats: best throughput's
coefficient of variation <= 1.5% (issue 34's stability goal; 3% before).

Usage: .venv/bin/python benchmarks/default_runs.py [--plan tiny=3,resnet50=3,...]
Writes benchmarks/results/default_runs.json, whole, with its provenance (benchmarks/provenance.py); after every run
an interim copy marked "complete": false.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from provenance import RESULTS, Record, recorded
from tiny_model import build_tiny_image_onnx

CV_GOAL = 0.015  # best throughput's coefficient of variation over a model's repeated runs
DEFAULT_PLAN = "tiny=3,resnet50=3,resnet50:small=1,widedeep=1,fastpitch=1,dlrm=1,dcnv2=1,nnunet=1"


def parse_plan(text: str) -> list[tuple[str, str | None, int]]:
    plan = []
    for item in text.split(","):
        what, _, repeats = item.partition("=")
        model, _, size = what.partition(":")
        plan.append((model.strip(), size.strip() or None, int(repeats or 1)))
    return plan


def run_once(model: str, size: str | None, tiny: Path) -> dict:
    tbench = Path(sys.executable).with_name("tbench")
    target = ["--model-file", str(tiny)] if model == "tiny" else [model] + (["--size", size] if size else [])
    out = tempfile.mkdtemp(prefix="tbench-default-")
    start = time.monotonic()
    done = subprocess.run([str(tbench), "run", *target, "--output", out], capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode not in (0, 3):  # 3: completed with failed points, which the record shows
        return {"status": "failed", "error": (done.stderr.strip().splitlines() or ["?"])[-1], "wall_s": round(wall, 1)}
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    m = json.loads((run_dir / "manifest.json").read_text())
    flow = (dt.datetime.fromisoformat(m["finished_at"]) - dt.datetime.fromisoformat(m["started_at"])).total_seconds()
    perf = sum(s["seconds"] for name, s in m["stages"].items() if name.startswith("perf-"))
    results = pd.read_parquet(run_dir / "results.parquet")
    ok = results[results["status"] == "ok"]
    offline = ok[ok["scenario"] == "offline"].sort_values("batch_size")
    b1 = offline[offline["batch_size"] == 1]
    tput = offline["throughput_infer_per_s"].tolist()
    return {
        "status": m["status"],
        "run_dir": str(run_dir),
        "model_size": f"{m['request']['model']} {m['request']['size']}",
        "wall_s": round(wall, 1),
        "flow_s": round(flow, 1),
        "perf_analyzer_s": round(perf, 1),
        "perf_share_pct": round(100 * perf / flow, 1),
        "points": len(results),
        "points_ok": len(ok),
        "best_throughput": round(float(ok["throughput_infer_per_s"].max()), 2) if len(ok) else None,
        "offline_b1_queue_ms": round(float(b1["server_queue_ms"].iloc[0]), 4) if len(b1) else None,
        "offline_throughput_by_batch": dict(
            zip(offline["batch_size"].astype(int).astype(str), [round(t, 1) for t in tput])
        ),
        "offline_throughput_monotonic": all(b >= a for a, b in zip(tput, tput[1:])),
        "window_s": [round(w, 2) for w in ok["window_s"].tolist()],
        "stages_s": {k: v["seconds"] for k, v in m["stages"].items()},
        "cpu_speed": (m.get("host") or {}).get("cpu_speed"),  # the CPU probe before and after the sweeps
    }


def goals(run: dict) -> dict:
    if run["status"] != "completed":
        return {"completed": False}
    return {
        "wall_le_180s": run["wall_s"] <= 180,
        "perf_share_ge_60pct": run["perf_share_pct"] >= 60,
        "all_points_stable": run["points_ok"] == run["points"],
        "offline_b1_queue_le_0.1ms": run["offline_b1_queue_ms"] is None or run["offline_b1_queue_ms"] <= 0.1,
        "offline_throughput_monotonic": run["offline_throughput_monotonic"],
    }


def measure(record: Record, plan: list[tuple[str, str | None, int]], tiny: Path) -> None:
    record["plan"] = [{"model": m, "size": s, "repeats": r} for m, s, r in plan]
    record["models"] = []
    for model, size, repeats in plan:
        runs = []
        for i in range(repeats):
            run = run_once(model, size, tiny)
            run["goals"] = goals(run)
            runs.append(run)
            print(
                f"{model} {size or ''} run {i + 1}: "
                + ", ".join(
                    f"{k}={run.get(k)}"
                    for k in (
                        "status",
                        "wall_s",
                        "perf_share_pct",
                        "points_ok",
                        "points",
                        "best_throughput",
                        "offline_b1_queue_ms",
                        "offline_throughput_by_batch",
                    )
                )
                + f" goals={run['goals']}",
                flush=True,
            )
        best = [r["best_throughput"] for r in runs if r.get("best_throughput")]
        cv = statistics.stdev(best) / statistics.mean(best) if len(best) > 1 else None
        entry = {
            "model": model,
            "size": size,
            "model_size": runs[0].get("model_size", f"{model} {size or 'default'}"),
            "runs": runs,
            "best_throughput_cv_pct": round(100 * cv, 2) if cv is not None else None,
            "cv_le_1_5pct": cv <= CV_GOAL if cv is not None else None,
        }
        if cv is not None:
            print(
                f"{model} {size or ''}: best throughput {best}, CV {100 * cv:.2f}% (goal <= {100 * CV_GOAL:g}%)",
                flush=True,
            )
        record["models"].append(entry)
        if entry["model_size"] not in record.model_sizes:
            record.model_sizes.append(entry["model_size"])
        record.save()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", default=DEFAULT_PLAN, help="MODEL[:SIZE]=REPEATS, comma separated")
    args = parser.parse_args()
    plan = parse_plan(args.plan)
    tiny = build_tiny_image_onnx(Path(tempfile.mkdtemp(prefix="tbench-tiny-")) / "tiny.onnx")
    with recorded(RESULTS / "default_runs.json") as record:
        measure(record, plan, tiny)


if __name__ == "__main__":
    main()
