"""The wall time a second identical run saves through caching (`reuse_measurements`).

Runs the benchmark flow twice with the same request, with fresh conversion and point caches (temporary folders):
the first run converts and measures everything, the second should convert nothing (artifacts.json: cached) and
measure nothing (results: reused_from). Prints and writes both wall times, stage by stage, to
benchmarks/results/rerun_savings.json, whole, with its provenance (benchmarks/provenance.py).

Usage: .venv/bin/python benchmarks/rerun_savings.py [--model resnet50] [--size small]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from provenance import RESULTS, recorded

from tbench.core.settings import configure_prefect_env

configure_prefect_env()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--size", default="small")
    args = parser.parse_args()
    with recorded(RESULTS / "rerun_savings.json", model_sizes=[f"{args.model} {args.size}"]) as record:
        record.update(measure(args.model, args.size))


def measure(model: str, size: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix="tbench-rerun-"))
    os.environ["TBENCH_CACHE_DIR"] = str(work / "conversions")
    os.environ["TBENCH_POINT_CACHE_DIR"] = str(work / "points")
    import pandas as pd

    from flows.benchmark import benchmark_flow
    from tbench.request.benchmark import BenchmarkRequest

    request = BenchmarkRequest(model=model, size=size, output=str(work / "runs"), reuse_measurements=True)
    runs = []
    for attempt in ("first", "second"):
        started = time.monotonic()
        url = benchmark_flow(request)
        wall = time.monotonic() - started
        run = Path(url)
        manifest = json.loads((run / "manifest.json").read_text())
        results = pd.read_parquet(run / "results.parquet")
        artifacts = json.loads((run / "artifacts.json").read_text())
        runs.append(
            {
                "run": attempt,
                "wall_s": round(wall, 1),
                "status": manifest["status"],
                "points": len(results),
                "points_reused": int(results["reused_from"].notna().sum()),
                "conversions_run": sum(not a["cached"] for a in artifacts),
                "stages_s": {k: v["seconds"] for k, v in manifest["stages"].items()},
            }
        )
        print(
            f"{attempt}: {wall:.1f} s, {runs[-1]['points_reused']}/{len(results)} points reused, "
            f"{runs[-1]['conversions_run']} conversions run",
            flush=True,
        )
    saved = runs[0]["wall_s"] - runs[1]["wall_s"]
    out = {
        "model": model,
        "size": size,
        "runs": runs,
        "saved_s": round(saved, 1),
        "saved_pct": round(100 * saved / runs[0]["wall_s"], 1),
    }
    print(
        f"the second identical run took {runs[1]['wall_s']:.1f} s instead of {runs[0]['wall_s']:.1f} s: "
        f"{saved:.1f} s ({out['saved_pct']:.0f}%) saved"
    )
    return out


if __name__ == "__main__":
    main()
