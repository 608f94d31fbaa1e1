"""The sustainable rate under a p99 SLO, found and then checked: for each model, `tbench capacity` finds the highest
Poisson rate whose p99 meets the SLO (one configuration, so the number is the rate search's, not the configuration
search's), then the rate is re-measured at 0.9x and 1.1x of it, each as a one-point `tbench capacity --start-rps R
--max-points 1` (the same measurement and verdict). The SLO should hold below and fail above; where it does not, the
record says which. Records the rate, the points it took, their wall time and both re-measurements.

Usage: .venv/bin/python benchmarks/capacity.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import RESULTS, recorded

TBENCH = str(Path(sys.executable).with_name("tbench"))
# model, size, SLO (ms), traffic (req/s), the one configuration's max batch size
CASES = [
    ("resnet50", "small", 20.0, 200.0, 8),
    ("widedeep", None, 200.0, 20.0, 1024),  # its CPU profile sends 256 samples a request
]


def capacity(model: str, size: str | None, slo: float, traffic: float, batch: int, out: Path, *extra: str) -> dict:
    argv = [TBENCH, "capacity", model, "--slo-p99-ms", f"{slo:g}", "--traffic", f"{traffic:g}", "--instances", "1"]
    argv += ["--max-batch-sizes", str(batch), "--output", str(out), *(["--size", size] if size else []), *extra]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    answer = json.loads((run_dir / "capacity.json").read_text())["answers"][0]
    return {"command": " ".join(argv[1:]), "wall_s": round(wall, 1), "run_dir": str(run_dir), "answer": answer}


def point_summary(p: dict) -> dict:
    keys = ("rate", "status", "latency_ms", "throughput", "requests", "delayed_pct", "reason")
    return {k: p.get(k) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-points", type=int, default=6)
    args = parser.parse_args()
    cases = CASES
    with recorded(RESULTS / "capacity.json", model_sizes=[f"{m} {s or 'default'}" for m, s, *_ in cases]) as record:
        out = Path(tempfile.mkdtemp(prefix="tbench-capacity-bench-"))
        results = []
        for model, size, slo, traffic, batch in cases:
            found = capacity(model, size, slo, traffic, batch, out, "--max-points", str(args.max_points))
            rate_search = found["answer"]["rate"]
            rate = rate_search["rate"] if rate_search else None
            entry = {
                "model": model,
                "size": size or "default",
                "slo_p99_ms": slo,
                "traffic_rps": traffic,
                "configuration": found["answer"]["configuration"],
                "rate_rps": rate,
                "stopped": rate_search["stopped"] if rate_search else found["answer"]["reason"],
                "points": [point_summary(p) for p in rate_search["points"]] if rate_search else [],
                "load_points": len(rate_search["points"]) if rate_search else 0,
                "search_s": round(rate_search["seconds"], 1) if rate_search else None,
                "wall_s": found["wall_s"],
                "plan": found["answer"]["plan"],
                "remeasured": {},
            }
            print(f"{model}: {rate} req/s after {entry['load_points']} points, {entry['wall_s']} s", flush=True)
            if rate:
                for factor in (0.9, 1.1):
                    again = capacity(
                        model,
                        size,
                        slo,
                        traffic,
                        batch,
                        out,
                        "--start-rps",
                        f"{rate * factor:.3f}",
                        "--max-points",
                        "1",
                    )
                    point = again["answer"]["rate"]["points"][0]
                    expected = "pass" if factor < 1 else "fail"
                    got = "pass" if point["status"] == "pass" else "fail"
                    entry["remeasured"][f"{factor:g}x"] = {
                        **point_summary(point),
                        "expected": expected,
                        "as_expected": got == expected,
                        "wall_s": again["wall_s"],
                    }
                    print(f"  {factor:g}x = {point['rate']}: {point['status']} {point.get('reason') or ''}", flush=True)
            results.append(entry)
            record.update({"cases": results})
            record.save()
        record.update({"cases": results})


if __name__ == "__main__":
    main()
