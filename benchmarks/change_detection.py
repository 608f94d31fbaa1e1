"""The change detector (tbench.history.detect) on simulated nightly series with the noise our runs really show: the
share of planted 5%, 10% and 20% steps it finds, and its false alarms on series without a change.

Where the noise comes from (read from the repository each time, listed in the results file):
- night-to-night spread (the noise added to every simulated night): the CV across repeated runs of the same point,
  from benchmarks/results/default_runs.json (`best_throughput_cv_pct` and each offline batch's throughput over the
  repeated runs of a model) and benchmarks/results/latency_verdict.json (throughput, p99 and mean latency of the
  baseline and the unchanged runs of the sleeper);
- each point's reported noise (what the detector is given): the window CVs of the real perf_analyzer logs in
  tests/golden/perf_analyzer/*.log (tbench.loadgen.perf_analyzer.noise_from_log). It is only reported: the
  night-to-night spread above already holds each run's own scatter.

Two kinds of series, as many of each: throughput (night-to-night CV drawn per series from the throughput spreads,
window CVs per night from the logs' throughput CVs) and latency (the latency spreads, the logs' latency CVs). Each
series has `--nights` nights; a planted step of 5/10/20% (up or down at random) starts at a night drawn uniformly
from `min_size` (3) to nights - 3, so at least 3 nights before and 3 after it. A step counts as found when the
detector reports a change of the same sign whose index is within +-1 night of the planted one. Every change it
reports in a series without a step is a false alarm (per 100 series-nights: changes / (series x nights) x 100);
changes elsewhere in a series with a step are counted apart ("extra_changes_per_100_series_nights").

Also measured, not the headline: the same with outlier nights (each night, with probability 2%, 10-25% off, either
way: a noisy neighbour); the newest-run verdict (`judge`, what the history takes) night by night: how many nights
after a step it first flags it (a change it newly confirms, or a candidate, of the step's sign within min_size nights
of it: judge may first place a change up to a segment off), and how many nights without a change it flags (newly
confirmed changes and candidates apart); and the
trade-off behind the defaults on fewer series (`sensitivity`: looser p-values, the window CV as a value's noise); how
often a found step is placed on its night exactly (`placed_exactly_share`); and where a 20% step is placed when the
night before it or its own first night is a wild one (`wild_night_at_a_step`).

Usage: .venv/bin/python benchmarks/change_detection.py [--series 5000] [--nights 30] [--seed 0] [--sizes all]
Writes benchmarks/results/change_detection.json, whole, with its provenance (benchmarks/provenance.py).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from provenance import REPO, RESULTS, recorded

from tbench.history import detect
from tbench.loadgen.perf_analyzer import noise_from_log

STEPS = (0.05, 0.1, 0.2)
GOLDEN = REPO / "tests" / "golden" / "perf_analyzer"


def _cv_pct(values) -> float:
    a = np.asarray(values, dtype=float)
    return float(a.std(ddof=1) / a.mean() * 100)


def measured_noise(sizes: set[str] | None) -> dict:
    """Run-to-run spreads and window CVs (all in %) from the repository's real results, with where each came from."""
    spread: dict[str, list[dict]] = {"throughput": [], "latency": []}
    model_sizes: list[str] = []

    def add(kind: str, model_size: str, what: str, cv_pct: float) -> None:
        if sizes is None or model_size in sizes:
            spread[kind].append({"model_size": model_size, "what": what, "cv_pct": round(cv_pct, 3)})
            if model_size not in model_sizes:
                model_sizes.append(model_size)

    default_runs = json.loads((RESULTS / "default_runs.json").read_text())
    for m in default_runs["models"]:
        runs = [r for r in m["runs"] if r.get("status") == "completed"]
        if len(runs) < 2:
            continue
        if m.get("best_throughput_cv_pct") is not None:
            add("throughput", m["model_size"], "best_throughput_cv_pct", m["best_throughput_cv_pct"])
        batches = set.intersection(*(set(r["offline_throughput_by_batch"]) for r in runs))
        for b in sorted(batches, key=int):
            cv = _cv_pct([r["offline_throughput_by_batch"][b] for r in runs])
            add("throughput", m["model_size"], f"offline batch {b} throughput over {len(runs)} runs", cv)
    verdict = json.loads((RESULTS / "latency_verdict.json").read_text())
    runs = [verdict["baseline"], *verdict["unchanged"]]
    size = verdict["provenance"]["model_sizes"][0]
    for kind, key in (("throughput", "throughput_infer_per_s"), ("latency", "p99_ms"), ("latency", "avg_ms")):
        add(kind, size, f"{key} over {len(runs)} unchanged runs", _cv_pct([r[key] for r in runs]))
    window = {"throughput": [], "latency": []}
    logs = []
    for log in sorted(GOLDEN.glob("*.log")):
        noise = noise_from_log(log.read_text())
        if noise.assumed:
            continue
        window["throughput"].append(round(noise.throughput_cv * 100, 3))
        window["latency"].append(round(noise.latency_cv * 100, 3))
        logs.append(str(log.relative_to(REPO)))
    for kind in spread:
        if not spread[kind]:
            raise SystemExit(f"no {kind} run-to-run spread for the model sizes {sorted(sizes or [])}")
    return {"run_to_run_cv_pct": spread, "window_cv_pct": window, "window_cv_logs": logs, "model_sizes": model_sizes}


def simulate(rng, kind: str, noise: dict, nights: int, step: float, outliers: bool = False):
    """(values, reported noise, planted index or None, signed step) of one series."""
    sigma = rng.choice([s["cv_pct"] for s in noise["run_to_run_cv_pct"][kind]]) / 100
    reported = rng.choice(noise["window_cv_pct"][kind], size=nights) / 100
    level = np.ones(nights)
    at, signed = None, 0.0
    if step:
        at = int(rng.integers(detect.MIN_SIZE, nights - 3 + 1))
        signed = step * rng.choice([-1.0, 1.0])
        level[at:] *= 1 + signed
    values = 1000.0 * level * (1 + rng.normal(0.0, sigma, nights))
    if outliers:
        hit = rng.random(nights) < 0.02
        values[hit] *= 1 + rng.choice([-1.0, 1.0], hit.sum()) * rng.uniform(0.10, 0.25, hit.sum())
    return values, reported, at, signed


def _found(changes, at: int, signed: float) -> bool:
    return any(abs(c.index - at) <= 1 and np.sign(c.relative) == np.sign(signed) for c in changes)


def detection(rng, noise: dict, series: int, nights: int, outliers: bool = False, **detector) -> dict:
    """found share per step size and false alarms, over `series` series of each kind per step size and without
    (`detector`: detect_changes' keyword arguments, its defaults where not given)."""
    out: dict = {"found_share": {}, "by_kind": {}}
    false_alarms = extra = series_nights_null = series_nights_step = 0
    for kind in ("throughput", "latency"):
        by_kind = out["by_kind"][kind] = {"found_share": {}}
        for step in STEPS:
            found = exact = 0
            for _ in range(series):
                values, reported, at, signed = simulate(rng, kind, noise, nights, step, outliers)
                changes = detect.detect_changes(values, reported, **detector)
                found += _found(changes, at, signed)
                exact += any(c.index == at and np.sign(c.relative) == np.sign(signed) for c in changes)
                extra += sum(1 for c in changes if abs(c.index - at) > 1)
                series_nights_step += nights
            by_kind["found_share"][str(step)] = round(found / series, 4)
            by_kind.setdefault("placed_exactly_share", {})[str(step)] = round(exact / series, 4)
        alarms = 0
        for _ in range(series):
            values, reported, _, _ = simulate(rng, kind, noise, nights, 0.0, outliers)
            alarms += len(detect.detect_changes(values, reported, **detector))
        by_kind["false_alarms_per_100_series_nights"] = round(100 * alarms / (series * nights), 4)
        false_alarms += alarms
        series_nights_null += series * nights
    for step in STEPS:
        shares = [out["by_kind"][k]["found_share"][str(step)] for k in ("throughput", "latency")]
        out["found_share"][str(step)] = round(float(np.mean(shares)), 4)
    out["false_alarms_per_100_series_nights"] = round(100 * false_alarms / series_nights_null, 4)
    out["false_alarms"] = false_alarms
    out["series_nights_without_change"] = series_nights_null
    out["extra_changes_per_100_series_nights"] = round(100 * extra / series_nights_step, 4)
    return out


def newest_run(rng, noise: dict, series: int, nights: int, step: float = 0.1, outliers: bool = False) -> dict:
    """judge night by night (each night's run judged against the nights before it, from night 2 x min_size): nights
    flagged in series without a change, and for a planted step the first night it is flagged."""
    first = 2 * detect.MIN_SIZE
    flagged = {"confirmed": 0, "candidate": 0}
    judged = 0
    delays: list[int | None] = []
    for kind in ("throughput", "latency"):
        for _ in range(series):
            values, reported, _, _ = simulate(rng, kind, noise, nights, 0.0, outliers)
            for t in range(first, nights + 1):
                verdict = detect.judge(values[:t], reported[:t])
                judged += 1
                flagged["confirmed"] += bool(verdict.new)
                flagged["candidate"] += verdict.candidate is not None
        for _ in range(series):
            values, reported, at, signed = simulate(rng, kind, noise, nights, step, outliers)
            delay = None
            for t in range(max(first, at + 1), nights + 1):
                verdict = detect.judge(values[:t], reported[:t])
                told = [*verdict.new, *([verdict.candidate] if verdict.candidate else [])]
                if any(abs(c.index - at) <= detect.MIN_SIZE and np.sign(c.relative) == np.sign(signed) for c in told):
                    delay = t - 1 - at  # 0: flagged by the run on the step's own night
                    break
            delays.append(delay)
    caught = [d for d in delays if d is not None]
    return {
        "step": step,
        "nights_judged_without_change": judged,
        "flagged_per_100_nights_without_change": {k: round(100 * v / judged, 4) for k, v in flagged.items()},
        "step_flagged_within_nights": {
            str(n): round(sum(1 for d in caught if d <= n) / len(delays), 4) for n in range(0, 4)
        },
        "step_flagged_by_the_last_night": round(len(caught) / len(delays), 4),
        "series_with_a_step": len(delays),
    }


def sensitivity(rng, noise: dict, series: int, nights: int) -> list[dict]:
    """The trade-off behind the defaults, on fewer series: a looser p-value (more 10% steps found, more false
    alarms), and a value's own noise taken as its window CV itself rather than CV / sqrt(3)."""
    out = []
    for params in ({"alpha": 0.002}, {"alpha": 0.005}, {"alpha": 0.01}, {"noise_windows": 1}):
        r = detection(rng, noise, series, nights, **params)
        out.append(
            {
                "params": params,
                "series_per_kind_and_step": series,
                "found_share": r["found_share"],
                "found_share_10pct_throughput": r["by_kind"]["throughput"]["found_share"]["0.1"],
                "false_alarms_per_100_series_nights": r["false_alarms_per_100_series_nights"],
            }
        )
    return out


def wild_night_at_a_step(rng, noise: dict, series: int, nights: int, step: float = 0.2) -> dict:
    """Where a step is placed when the night just before it, or its own first night, is a wild one: off by 1.5-2.25
    steps from its level, the step's way (past the other level by a half to 1.25 steps: far from both, so it says
    nothing of which side of the step it is on) or the other way. Shares of the series by where the change of the
    step's sign nearest to the step was placed."""
    out: dict = {"step": step, "series_per_kind_and_case": series}
    for night, shift in (("night_before", -1), ("first_night", 0)):
        for way, sign in (("the_steps_way", 1.0), ("the_other_way", -1.0)):
            places = {"at_the_step": 0, "one_early": 0, "one_late": 0, "elsewhere_or_missed": 0}
            for kind in ("throughput", "latency"):
                for _ in range(series):
                    values, reported, at, signed = simulate(rng, kind, noise, nights, step)
                    # the first night is wild from the new level, the night before from the old one
                    level = 1.0 if shift else 1 + signed
                    values[at + shift] *= (level + sign * signed * rng.uniform(1.5, 2.25)) / level
                    changes = detect.detect_changes(values, reported)
                    offsets = [c.index - at for c in changes if np.sign(c.relative) == np.sign(signed)]
                    offset = min(offsets, key=abs) if offsets else None
                    places[{0: "at_the_step", -1: "one_early", 1: "one_late"}.get(offset, "elsewhere_or_missed")] += 1
            out[f"{night}_{way}"] = {k: round(v / (2 * series), 4) for k, v in places.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=5000, help="series per kind and step size (and without)")
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sizes", default="all", help='model sizes whose run-to-run spread is used, e.g. "resnet50 full,tiny file"'
    )
    parser.add_argument("--newest-series", type=int, default=1000, help="series per kind for the newest-run part")
    args = parser.parse_args()
    sizes = None if args.sizes == "all" else {s.strip() for s in args.sizes.split(",") if s.strip()}
    noise = measured_noise(sizes)
    with recorded(RESULTS / "change_detection.json", model_sizes=noise["model_sizes"]) as record:
        record["settings"] = vars(args) | {
            "detector": {
                "module": "tbench.history.detect",
                "min_effect": detect.MIN_EFFECT,
                "alpha": detect.ALPHA,
                "min_size": detect.MIN_SIZE,
                "noise_factor": detect.NOISE_FACTOR,
                "penalty": detect.PENALTY,
                "noise_windows": detect.NOISE_WINDOWS,
                "candidate_z": detect.CANDIDATE_Z,
            },
            "found_rule": "a reported change of the same sign within +-1 night of the planted step",
            "step_nights": f"uniform in [{detect.MIN_SIZE}, nights - 3]: at least 3 nights before and after",
        }
        record["noise"] = noise
        rng = np.random.default_rng(args.seed)
        t0 = time.monotonic()
        headline = detection(rng, noise, args.series, args.nights)
        record.update(headline)
        record["detection_s"] = round(time.monotonic() - t0, 1)
        print(json.dumps(headline, indent=1), flush=True)
        record.save()
        record["with_outlier_nights"] = detection(rng, noise, max(1, args.series // 4), args.nights, outliers=True)
        print(json.dumps(record["with_outlier_nights"], indent=1), flush=True)
        record["newest_run"] = newest_run(rng, noise, args.newest_series, args.nights)
        print(json.dumps(record["newest_run"], indent=1), flush=True)
        record["newest_run_with_outlier_nights"] = newest_run(
            rng, noise, args.newest_series, args.nights, outliers=True
        )
        print(json.dumps(record["newest_run_with_outlier_nights"], indent=1), flush=True)
        record["sensitivity"] = sensitivity(rng, noise, max(1, args.series // 5), args.nights)
        print(json.dumps(record["sensitivity"], indent=1), flush=True)
        # last, on a generator of its own: the figures above stay what they were for the same seed
        record["wild_night_at_a_step"] = wild_night_at_a_step(
            np.random.default_rng(args.seed + 1), noise, max(1, args.series // 5), args.nights
        )
        print(json.dumps(record["wild_night_at_a_step"], indent=1), flush=True)
        record["goals"] = {
            "found_10pct_ge_95pct": record["found_share"]["0.1"] >= 0.95,
            "false_alarms_lt_1_per_100_series_nights": record["false_alarms_per_100_series_nights"] < 1,
        }


if __name__ == "__main__":
    main()
