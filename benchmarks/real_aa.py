"""Real A/A and planted-change comparisons on this machine: does `tbench compare` stay quiet on two runs of one commit,
name a busy neighbour instead of blaming the model, and find a model made slower with the trials it asks for?

Every run is `tbench run ...` in a subprocess (its own server), one after the other, each with its start time:
1. **spread**: `--runs` rounds of fresh runs of the small ResNet-50, one each way per round: unpinned
   (`--no-pin-cpus`: the placement before the run-to-run issue, server and perf_analyzer anywhere on the machine's
   cores, ONNX Runtime on every core), as the default runs now (tbench.node.placement: pinned from `MIN_CORES` cores
   on), and pinned on this machine whatever its cores (`TBENCH_PIN_MIN_CORES=2`: the server on one core, perf_analyzer
   and tbench on the other): the per-point CV of throughput across runs, before (unpinned), after (the default) and
   pinned.
2. **aa**: `tbench compare` on every ordered pair of the default ResNet-50 runs and of `--tiny-runs` runs of the tiny
   model (benchmarks/tiny_model.py), as a user runs it (one trial each: no spread known) and with the machine's
   run-to-run spread stated (`--run-cv` and `--run-cv-p99`: the median per-point CV of throughput and of p99 that the
   runs of that model just showed).
3. **neighbour**: `--neighbour-runs` tiny runs with a busy loop started beside them, each compared against the
   first two idle tiny runs with the spread stated: never exit 1 (0, or 2 naming the neighbour).
4. **planted**: the tiny model and the same model with two more 3x3 convolutions (`PLANTED_LAYERS`, saved under the
   same file name so that its points match), `--planted-runs` runs of each (the offline sweep), alternating, every
   point measured in the trials that `tbench compare` says resolve 5% at the spread measured in 2 (capped by
   `--max-trials`); every (baseline, candidate) pair compared: the share found (exit 1), and the slowdown the runs
   actually measured.
5. **machine**: each run's CPU probe (tbench.node.cpu_speed, before and after its sweeps) and stolen CPU, and per set
   of runs how far the probe moved and how closely it tracks the runs' best throughput: is a drift between runs the
   machine's?

Usage: .venv/bin/python benchmarks/real_aa.py [--runs 5] [--tiny-runs 4] [--neighbour-runs 3] [--planted-runs 4]
       .venv/bin/python benchmarks/real_aa.py --planted-only TRIALS [--planted-runs 4]
Writes benchmarks/results/real_aa.json (real_aa_planted.json with --planted-only) with its provenance; an interim copy
after every run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from provenance import RESULTS, recorded, utc_now
from tiny_model import build_tiny_image_onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # standalone: the repository's tbench

from tbench.results.run_noise import RunSpread  # noqa: E402

TBENCH = str(Path(sys.executable).with_name("tbench"))
TPUT = "throughput_infer_per_s"
P99 = "p99_ms"
POINT = ["scenario", "format", "batch_size", "concurrency", "request_rate"]
MIN_EFFECT = 0.05
PLANTED_LAYERS = 2  # 3x3 convolutions added to the tiny model: one made its best point only 6.6% slower


def run(target: list[str], out: Path, extra: list[str] = (), neighbour: bool = False, env: dict | None = None) -> dict:
    """One `tbench run` in its own process; `neighbour`: a busy loop beside it for its whole length."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if neighbour else None
    started = utc_now()
    start = time.monotonic()
    try:
        argv = [TBENCH, "run", *target, *extra, "--output", str(out)]
        done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})})
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    wall = round(time.monotonic() - start, 1)
    if done.returncode not in (0, 3):
        return {
            "ok": False,
            "started": started,
            "wall_s": wall,
            "error": (done.stderr.strip().splitlines() or ["?"])[-1],
        }
    folder = Path(done.stdout.strip().splitlines()[-1])
    manifest = json.loads((folder / "manifest.json").read_text())
    host = manifest.get("host") or {}
    return {
        "ok": True,
        "run_dir": str(folder),
        "started": started,
        "wall_s": wall,
        "placement": manifest.get("placement"),
        "neighbour_cpu_pct": (host.get("other_cpu_pct") or {}).get("mean"),
        "steal_pct": (host.get("steal_pct") or {}).get("mean"),
        "cpu_speed": host.get("cpu_speed"),
    }


def take(record, key: str, label: str, target: list[str], out: Path, **kw) -> dict:
    """One run into `record[key]`, printed, and the record saved (an interrupted benchmark keeps every run)."""
    record.setdefault(key, []).append(run(target, out, **kw))
    print(f"{key} {label}: {record[key][-1]}", flush=True)
    record.save()
    return record[key][-1]


def machine_speed(runs: list[dict]) -> dict | None:
    """How far the CPU probe moved over a set of runs, and its correlation with each run's best throughput (the
    best-throughput point of the set's first run): near 1 where the runs' drift is the machine's."""
    rows = [
        (max((r["cpu_speed"] or {}).values()), r)  # the better reading, as tbench compare reads it
        for r in runs
        if r["ok"] and (r.get("cpu_speed") or {}).values()
    ]
    if len(rows) < 3:
        return None
    speeds = [speed for speed, _ in rows]
    table = point_table([r for _, r in rows])
    best = [float(v) for v in table.loc[table.iloc[:, 0].idxmax()]]
    try:
        r = round(statistics.correlation(speeds, best), 3)
    except statistics.StatisticsError:  # a constant probe or throughput: nothing to track
        r = None
    return {
        "runs": len(rows),
        "probe_range": [round(min(speeds), 2), round(max(speeds), 2)],
        "probe_cv_pct": round(100 * statistics.stdev(speeds) / statistics.fmean(speeds), 2),
        "best_throughput_cv_pct": round(100 * statistics.stdev(best) / statistics.fmean(best), 2),
        "r_probe_best_throughput": r,
        "steal_pct_max": max((r.get("steal_pct") or 0.0) for _, r in rows),
    }


def point_table(runs: list[dict], metric: str = TPUT) -> pd.DataFrame:
    """Per point, each run's mean `metric` over its trials (ok rows only), runs as columns."""
    series = {}
    for i, r in enumerate(runs):
        if not r["ok"]:
            continue
        df = pd.read_parquet(Path(r["run_dir"]) / "results.parquet")
        df = df[df["status"] == "ok"].fillna({"concurrency": 0, "request_rate": 0})
        series[i] = df.groupby(POINT)[metric].mean()
    return pd.DataFrame(series)


def per_point_cv(runs: list[dict], metric: str = TPUT) -> dict:
    table = point_table(runs, metric).dropna()
    cvs = (table.std(axis=1, ddof=1) / table.mean(axis=1)).sort_values()
    best = table.max(axis=0)
    return {
        "runs": int(table.shape[1]),
        "points": int(table.shape[0]),
        "median_pct": round(100 * float(cvs.median()), 2),
        "max_pct": round(100 * float(cvs.max()), 2),
        "by_point_pct": {" ".join(str(v) for v in k): round(100 * float(c), 2) for k, c in cvs.items()},
        "best_throughput_cv_pct": round(100 * float(best.std(ddof=1) / best.mean()), 2),
    }


def compare(base: dict, cand: dict, floor: dict | None = None) -> dict:
    """`tbench compare` as a CI job runs it; `floor`: the spreads stated for throughput (and mean latency) and p99."""
    argv = [TBENCH, "compare", base["run_dir"], cand["run_dir"], "--output", tempfile.mkdtemp(prefix="tbench-cmp-")]
    if floor:
        argv += ["--run-cv", f"{floor['throughput']:.4f}", "--run-cv-p99", f"{floor['p99']:.4f}"]
    done = subprocess.run(argv, capture_output=True, text=True)
    line = (done.stdout.strip().splitlines() or [done.stderr.strip()])[-1]
    return {"exit": done.returncode, "line": line[:400]}


def pairs(runs: list[dict]) -> list[tuple[dict, dict]]:
    ok = [r for r in runs if r["ok"]]
    return list(itertools.permutations(ok, 2))


def exits(comparisons: list[dict]) -> dict:
    codes = [c["exit"] for c in comparisons]
    return {str(code): codes.count(code) for code in sorted(set(codes))}


def planted_phase(record, work: Path, tiny: Path, trials: int, runs_each: int) -> None:
    """The tiny model against the same model made slower (the same file name, so its points match), `runs_each` runs
    of each, alternating (a slow drift of the machine hits both sides alike), every point in `trials` trials."""
    slower = build_tiny_image_onnx(work / "slower" / tiny.name, extra_layers=PLANTED_LAYERS)
    base, cand = record.setdefault("runs_planted_base", []), record.setdefault("runs_planted", [])
    extra = ["--trials", str(trials), "--scenarios", "offline"]  # the offline sweep: a trial in ~30 s
    for i in range(runs_each):
        for model, key in ((tiny, "runs_planted_base"), (slower, "runs_planted")):
            take(record, key, f"{i + 1}/{runs_each}", ["--model-file", str(model)], work / "planted", extra=extra)
    planted = [compare(b, c) for b in base if b["ok"] for c in cand if c["ok"]]
    record["planted"] = planted
    record["planted_comparisons"] = len(planted)
    record["planted_found"] = sum(c["exit"] == 1 for c in planted)
    means = [point_table(runs).mean(axis=1) for runs in (base, cand)]
    slowdown = (means[1] / means[0] - 1).dropna()
    record["planted_slowdown_pct"] = {
        "best_point": round(100 * float(slowdown[means[0].dropna().idxmax()]), 2),
        "median_point": round(100 * float(slowdown.median()), 2),
    }
    print(json.dumps({k: record[k] for k in ("planted_comparisons", "planted_found", "planted_slowdown_pct")}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tiny-runs", type=int, default=4)
    parser.add_argument("--neighbour-runs", type=int, default=3)
    parser.add_argument("--planted-runs", type=int, default=4)
    parser.add_argument("--max-trials", type=int, default=5)
    parser.add_argument(
        "--planted-only",
        type=int,
        metavar="TRIALS",
        help="Only the planted phase, every point in TRIALS trials (what compare asked for in a full record), into "
        "benchmarks/results/real_aa_planted.json",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tbench-real-aa-"))
    tiny = build_tiny_image_onnx(work / "tiny.onnx")
    if args.planted_only:
        with recorded(RESULTS / "real_aa_planted.json", model_sizes=["tiny onnx"]) as record:
            record["planted_trials"] = {"used": args.planted_only, "planted_layers": PLANTED_LAYERS}
            planted_phase(record, work, tiny, args.planted_only, args.planted_runs)
        return
    resnet = ["resnet50", "--size", "small"]
    with recorded(RESULTS / "real_aa.json", model_sizes=["resnet50 small", "tiny onnx"]) as record:

        def measured(key: str, target: list[str], n: int, **kw) -> list[dict]:
            for i in range(n):
                take(record, key, f"{i + 1}/{n}", target, work / key, **kw)
            return record[key]

        # the three placements round by round, so that a drift of the machine over the session hits each alike (run
        # one set after another at c5b8779, the default set's best point rose by half over its 6 minutes)
        placements = {
            "runs_unpinned": {"extra": ["--no-pin-cpus"]},
            "runs_default": {},
            "runs_pinned_two_cores": {"env": {"TBENCH_PIN_MIN_CORES": "2"}},
        }
        for i in range(args.runs):
            for key, kw in placements.items():
                take(record, key, f"{i + 1}/{args.runs}", resnet, work / key, **kw)
        before, after, pinned = (record[key] for key in placements)
        record["per_point_cv_before"] = per_point_cv(before)
        record["per_point_cv_after"] = per_point_cv(after)
        record["per_point_cv_pinned_two_cores"] = per_point_cv(pinned)
        record["default_placement"] = after[0].get("placement")
        for key in ("before", "after", "pinned_two_cores"):
            print(key, record[f"per_point_cv_{key}"], flush=True)
        idle_tiny = measured("runs_tiny", ["--model-file", str(tiny)], args.tiny_runs)
        tiny_cv = per_point_cv(idle_tiny)
        record["per_point_cv_tiny"] = tiny_cv
        floors = {  # each metric's median per-point CV over the idle runs: the machine's spread, stated
            model: {
                "throughput": per_point_cv(runs)["median_pct"] / 100,
                "p99": per_point_cv(runs, P99)["median_pct"] / 100,
            }
            for model, runs in (("resnet50 small", after), ("tiny", idle_tiny))
        }
        record["stated_run_cv"] = floors

        comparisons = []
        for model, runs in (("resnet50 small", after), ("tiny", idle_tiny)):
            for base, cand in pairs(runs):
                comparisons.append(
                    {"model": model, "as_run": compare(base, cand), "stated": compare(base, cand, floors[model])}
                )
        record["aa"] = comparisons
        record["comparisons"] = len(comparisons)
        record["false_regressions"] = sum(c["as_run"]["exit"] == 1 for c in comparisons)
        record["false_regressions_stated"] = sum(c["stated"]["exit"] == 1 for c in comparisons)
        record["aa_exits"] = exits([c["as_run"] for c in comparisons])
        record["aa_exits_stated"] = exits([c["stated"] for c in comparisons])
        record.save()

        busy = measured("runs_neighbour", ["--model-file", str(tiny)], args.neighbour_runs, neighbour=True)
        neighbour = [
            compare(base, cand, floors["tiny"]) for base in idle_tiny[:2] if base["ok"] for cand in busy if cand["ok"]
        ]
        record["neighbour"] = neighbour
        record["neighbour_comparisons"] = len(neighbour)
        record["neighbour_false_regressions"] = sum(c["exit"] == 1 for c in neighbour)
        record["neighbour_named"] = sum(c["exit"] == 2 and "other processes used" in c["line"] for c in neighbour)
        record.save()

        # what compare asks for at the spread the idle runs showed, once trials measure it (tbench.results.run_noise)
        spread = RunSpread({TPUT: floors["tiny"]["throughput"], P99: floors["tiny"]["p99"]}, measured=True)
        needed = max(spread.trials_needed(m, MIN_EFFECT) or args.max_trials for m in (TPUT, P99))
        trials = min(needed or args.max_trials, args.max_trials)
        record["planted_trials"] = {"tool_asked": needed, "used": trials, "cap": args.max_trials}
        planted_phase(record, work, tiny, trials, args.planted_runs)
        summary = {k: record[k] for k in ("comparisons", "false_regressions", "neighbour_false_regressions")}
        print(
            json.dumps({**summary, "planted_found": record["planted_found"], "of": record["planted_comparisons"]}),
            flush=True,
        )
        print(
            f"per-point CV median {record['per_point_cv_before']['median_pct']}% -> "
            f"{record['per_point_cv_after']['median_pct']}% (max {record['per_point_cv_before']['max_pct']}% -> "
            f"{record['per_point_cv_after']['max_pct']}%)",
            flush=True,
        )
        record["median_of_walls_s"] = statistics.median(r["wall_s"] for r in after)
        keys = [*placements, "runs_tiny", "runs_planted_base", "runs_planted"]
        record["machine_speed"] = {key: machine_speed(record[key]) for key in keys}
        print("machine", json.dumps(record["machine_speed"]), flush=True)


if __name__ == "__main__":
    main()
