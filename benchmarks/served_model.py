"""A model already served, measured without tbench's files, beside `tbench run --model-file` of the same model on the
same server mode (embedded).

The small ResNet-50's ONNX file (exported by a first, short `tbench run`) is measured with `tbench run --model-file`
(tbench writes the repository and starts the embedded server itself); then an embedded server is started here on that
run's model repository, as a platform team's server would be, and `tbench run --served-model` measures it there with
the same grid. Rounds alternate the two. Online points run the same config in both (the repository's dynamic
batcher); offline points differ by design: `--model-file` reloads the model with static batching, a served model is
measured as served (its dynamic batcher). Writes benchmarks/results/served_model.json, whole, with its provenance.

Usage: .venv/bin/python benchmarks/served_model.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from provenance import RESULTS, recorded

TBENCH = str(Path(sys.executable).with_name("tbench"))
GRID = ["--batch-sizes", "1,4,8", "--concurrency", "1,2,4", "--window-s", "1"]
KEY = ["scenario", "batch_size", "concurrency"]


def tbench(*args: str) -> tuple[Path, float]:
    started = time.monotonic()
    done = subprocess.run([TBENCH, "run", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tbench run {' '.join(args)} failed ({done.returncode}): {done.stdout[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1]), time.monotonic() - started


def points(run_dir: Path) -> pd.DataFrame:
    results = pd.read_parquet(run_dir / "results.parquet")
    ok = results[results["status"] == "ok"]
    return ok[[*KEY, "throughput_infer_per_s", "p99_ms"]].set_index(KEY)


def main() -> None:
    from tbench.triton.process_server import EmbeddedServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with recorded(RESULTS / "served_model.json", model_sizes=["resnet50 small"]) as record:
        output = Path(tempfile.mkdtemp(prefix="tbench-served-bench-"))
        first, _ = tbench(
            "resnet50", "--size", "small", "--formats", "onnx", "--scenarios", "offline", "--batch-sizes", "1",
            "--window-s", "0.5", "--output", str(output),
        )  # fmt: skip
        onnx = next((first / "models").rglob("*.onnx"))
        by_file, by_served, walls = [], [], {"model_file": [], "served": []}
        for i in range(args.rounds):
            run, wall = tbench("--model-file", str(onnx), *GRID, "--output", str(output))
            walls["model_file"].append(round(wall, 1))
            by_file.append(points(run))
            server = EmbeddedServer(run / "model_repository", output / f"served{i}.log")
            server.start()
            try:
                url = f"{server.endpoints.grpc_url},{server.endpoints.http_url}"
                name = next(p.name for p in (run / "model_repository").iterdir())
                served, wall = tbench("--served-model", name, "--server-url", url, *GRID, "--output", str(output))
            finally:
                server.stop()
            walls["served"].append(round(wall, 1))
            by_served.append(points(served))
            print(f"round {i + 1}: model file {walls['model_file'][-1]} s, served {walls['served'][-1]} s", flush=True)
        file_median = pd.concat(by_file).groupby(KEY).median()
        served_median = pd.concat(by_served).groupby(KEY).median()
        both = file_median.join(served_median, lsuffix="_model_file", rsuffix="_served", how="inner")
        both["throughput_ratio"] = both["throughput_infer_per_s_served"] / both["throughput_infer_per_s_model_file"]
        both["p99_ratio"] = both["p99_ms_served"] / both["p99_ms_model_file"]
        rows = json.loads(both.round(3).reset_index().to_json(orient="records"))
        online = both.xs("online", level="scenario")
        record.update(
            {
                "model_file": str(onnx.relative_to(output)),
                "grid": GRID,
                "rounds": args.rounds,
                "points": rows,
                "online_throughput_ratio_median": round(statistics.median(online["throughput_ratio"]), 3),
                "online_p99_ratio_median": round(statistics.median(online["p99_ratio"]), 3),
                "wall_s": walls,
                "note": "offline: --model-file measures static batching, a served model as served (dynamic batcher)",
            }
        )
        print(both.round(3).to_string())


if __name__ == "__main__":
    main()
