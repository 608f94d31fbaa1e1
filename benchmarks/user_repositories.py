"""User repositories tried (issue 57's third goal): every kind of model a Triton repository holds, each through
`tbench run`, `tbench search` and `tbench capacity --repository DIR --model NAME[:VERSION]` on the embedded server,
each answered (exit 0, its figures) or refused in one line (exit 2, the line).

The repository is the test suite's (tests/test_user_repository.py and test_pipeline_steps.py write it): `doubler`, an
ONNX model with the user's dynamic batching, two instances and one ORT thread, in two versions; `plus_one`, a python
model; `pipeline`, an ensemble of the two; `bls`, a python model calling both per request. Each command is the
smallest of its kind (two batch sizes, one concurrency, short windows): what is measured is whether each kind runs,
searches and plans, not how fast.

Usage: .venv/bin/python benchmarks/user_repositories.py
Writes benchmarks/results/user_repositories.json with its provenance: `models` (per model: `kind` and, per command,
`exit`, `wall_s`, `answered` or the refusal's `line`, and its figures) and `all_answered_or_refused`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from provenance import RESULTS, recorded

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # standalone: the repository's tbench and the suite's repository

from test_pipeline_steps import bls_repository  # noqa: E402

from tbench.core.metrics import THROUGHPUT  # noqa: E402

TBENCH = str(Path(sys.executable).with_name("tbench"))
# model -> what kind of model it is, as a user would say it
MODELS = {
    "doubler:1": "ONNX model with the user's batching, version 1",
    "doubler:2": "the same model's version 2",
    "plus_one": "python model",
    "pipeline": "ensemble (ONNX + python)",
    "bls": "BLS python model calling two models",
}
SHORT = ["--window-s", "0.5", "--stability", "50"]
SPACE = ["--instances", "1,2", "--max-batch-sizes", "8", "--queue-delays-us", "500"]
COMMANDS = {
    "run": ["--batch-sizes", "1,4", "--concurrency", "2", "--no-pin-cpus", *SHORT],
    "search": [*SPACE, "--preferred", "max", "--strategy", "exhaustive", "--concurrency", "2"]
    + ["--confirm-rounds", "0", "--p99-budget-ms", "50", *SHORT],
    "capacity": [*SPACE, "--slo-p99-ms", "50", "--traffic", "200", "--max-points", "8", "--window-s", "0.5"],
}
REFUSED = 2  # tbench's exit for bad input: one line naming the fix


def figures(command: str, run_dir: Path) -> dict:
    """What the command answered, from its run folder."""
    if command == "run":
        rows = pd.read_csv(run_dir / "results.csv")
        manifest = json.loads((run_dir / "manifest.json").read_text())
        ok = rows[rows["status"] == "ok"]
        return {
            "points_ok": int(len(ok)),
            "points": int(len(rows)),
            "best_infer_per_s": round(float(ok[THROUGHPUT.column].max()), 1) if len(ok) else None,
            "served_by": manifest.get("repository", {}).get("served_by"),
            "pipeline_bounds": {s: b["line"] for s, b in manifest.get("pipeline_bounds", {}).items()},
        }
    summary = json.loads((run_dir / "search.json").read_text())
    best = summary.get("best") or {}
    found = {
        "measured": summary.get("measured"),
        "best": {k: best.get(k) for k in ("throughput", "p99_ms", "concurrency", "candidate")},
        "your_config": {k: (summary.get("your_config") or {}).get(k) for k in ("status", "throughput", "p99_ms")},
        "recommended": sorted(p.parent.name for p in (run_dir / "recommended").glob("*/config.pbtxt")),
    }
    if summary.get("steps"):  # an ensemble's: its steps searched
        found["steps"] = {name: (s.get("best") or {}).get("candidate") for name, s in summary["steps"].items()}
    if command == "capacity":
        answer = json.loads((run_dir / "capacity.json").read_text())["answers"][0]
        found["answer"] = {
            "status": answer.get("status"),
            "configuration": answer.get("configuration"),
            "sustainable_rps": (answer.get("rate") or {}).get("rate"),
            "instances_for_traffic": (answer.get("plan") or {}).get("instances"),
        }
    return found


def try_command(command: str, repo: Path, model: str, out: Path) -> dict:
    argv = [TBENCH, command, "--repository", str(repo), "--model", model, *COMMANDS[command], "--output", str(out)]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True)
    result = {"exit": done.returncode, "wall_s": round(time.monotonic() - start, 1)}
    errors = [line for line in done.stderr.strip().splitlines() if line.strip()]
    if done.returncode == REFUSED:
        result.update(answered=False, line=errors[-1] if errors else "", one_line=len(errors) == 1)
        return result
    if done.returncode != 0:
        result.update(answered=False, error=(errors or ["?"])[-1])
        return result
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    return {**result, "answered": True, "run_dir": str(run_dir), **figures(command, run_dir)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="Models of the repository to try.")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tbench-user-repos-"))
    repo = bls_repository(work / "repo")
    with recorded(RESULTS / "user_repositories.json", model_sizes=["tiny onnx, user repository"]) as record:
        record["models"] = {}
        for model in args.models.split(","):
            tried = record["models"][model] = {"kind": MODELS[model]}
            for command in COMMANDS:
                tried[command] = try_command(command, repo, model, work / "runs")
                print(model, command, json.dumps(tried[command], default=str)[:400], flush=True)
                record.save()
        record["all_answered_or_refused"] = all(
            c["answered"] or c.get("one_line", False)
            for tried in record["models"].values()
            for name, c in tried.items()
            if name != "kind"
        )
    return 0 if record["all_answered_or_refused"] else 1


if __name__ == "__main__":
    sys.exit(main())
