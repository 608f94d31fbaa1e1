"""Real A/B sessions on this machine: does `tbench run --model-file SLOWER --against TINY --trials N` find a model made
slower, when a whole run can shift by 13-22% (benchmarks/results/real_aa_planted.json), and stay quiet when both
files are the same model?

Each session is one `tbench run --against` in a subprocess: N rounds, the two files' runs back to back (the order
alternating), then `tbench compare` paired by round (tbench.results.session). First a pilot session of `--pilot-rounds`
rounds: its line states the rounds that would resolve 5% at the spread of the ratios it measured; every counted session
then runs that many (capped by `--max-rounds`; the cap stated in the record).
1. **planted**: `--sessions` sessions of the tiny model made slower (`PLANTED_LAYERS` more 3x3 convolutions, the same
   file name) against the tiny model: the share found (exit 1), and the slowdown each session's runs measured.
2. **aa**: `--aa-sessions` sessions of the tiny model against a copy of itself: false regressions (exit 1).
The offline sweep at `BATCH_SIZES`: two points, a round in about a minute.

Usage: .venv/bin/python benchmarks/real_ab_sessions.py [--sessions 10] [--aa-sessions 4] [--max-rounds 6]
Writes benchmarks/results/real_ab_sessions.json with its provenance; an interim copy after every session.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from provenance import RESULTS, recorded
from real_aa import PLANTED_LAYERS, TBENCH, point_table
from tiny_model import build_tiny_image_onnx

BATCH_SIZES = "2,8"
ROUNDS_ASKED = re.compile(r"--trials (\d+) rounds would resolve")


def session(new: Path, old: Path, out: Path, rounds: int) -> dict:
    """One `tbench run --against` session: its exit, its line, its folder, and the slowdown its runs measured."""
    argv = [TBENCH, "run", "--model-file", str(new), "--against", str(old), "--trials", str(rounds)]
    argv += ["--scenarios", "offline", "--batch-sizes", BATCH_SIZES, "--output", str(out)]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    result = {"exit": done.returncode, "rounds": rounds, "wall_s": round(time.monotonic() - start, 1)}
    folder = Path(lines[-2]) if len(lines) >= 2 else None
    if folder is None or not (folder / "session.json").is_file():
        return {**result, "line": ((done.stderr.strip().splitlines() or ["?"])[-1])[:400]}
    record = json.loads((folder / "session.json").read_text())
    means = [
        point_table([{"ok": True, "run_dir": r} for r in record["runs"][side]]).mean(axis=1)
        for side in ("baseline", "candidate")
    ]
    slowdown = (means[1] / means[0] - 1).dropna()
    return {
        **result,
        "line": record["summary"][:400],
        "folder": str(folder),
        "failed_runs": len(record["failed"]),
        "slowdown_pct": {
            "best_point": round(100 * float(slowdown[means[0].dropna().idxmax()]), 2),
            "median_point": round(100 * float(slowdown.median()), 2),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--aa-sessions", type=int, default=4)
    parser.add_argument("--pilot-rounds", type=int, default=3)
    parser.add_argument("--max-rounds", type=int, default=6)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tbench-ab-"))
    tiny = build_tiny_image_onnx(work / "tiny.onnx")
    slower = build_tiny_image_onnx(work / "slower" / tiny.name, extra_layers=PLANTED_LAYERS)
    copy = work / "copy" / tiny.name
    copy.parent.mkdir()
    shutil.copy(tiny, copy)
    with recorded(RESULTS / "real_ab_sessions.json", model_sizes=["tiny onnx"]) as record:
        record["batch_sizes"] = BATCH_SIZES
        record["planted_layers"] = PLANTED_LAYERS
        pilot = session(slower, tiny, work / "runs", args.pilot_rounds)
        asked = ROUNDS_ASKED.search(pilot["line"])
        rounds = min(int(asked.group(1)) if asked else args.max_rounds, args.max_rounds)
        record["pilot"] = pilot
        record["rounds"] = {
            "tool_asked": int(asked.group(1)) if asked else None,
            "used": rounds,
            "cap": args.max_rounds,
        }
        print(f"pilot: {pilot}\nrounds: {record['rounds']}", flush=True)
        record.save()

        def measured(key: str, new: Path, n: int) -> list[dict]:
            """`n` sessions of `new` against the tiny model, each kept in the record as it ends."""
            sessions = record.setdefault(key, [])
            for i in range(n):
                sessions.append(session(new, tiny, work / "runs", rounds))
                print(f"{key} {i + 1}/{n}: {sessions[-1]}", flush=True)
                record.save()
            return sessions

        planted = measured("planted", slower, args.sessions)
        record["planted_comparisons"] = len(planted)
        record["planted_found"] = sum(s["exit"] == 1 for s in planted)
        aa = measured("aa", copy, args.aa_sessions)
        record["aa_comparisons"] = len(aa)
        record["aa_false_regressions"] = sum(s["exit"] == 1 for s in aa)
        print(
            json.dumps(
                {
                    k: record[k]
                    for k in (
                        "rounds",
                        "planted_comparisons",
                        "planted_found",
                        "aa_comparisons",
                        "aa_false_regressions",
                    )
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
