"""`tbench compare` against a known truth: how often it calls two runs of one server a regression (A/A), how often it
finds a planted 10% throughput drop or 10% p99 rise, and whether a point the candidate lost ever passes.

Each simulated run is what perf_analyzer and the sweep report for an online sweep (concurrency 1, 2, 4, 8; one format
and scenario, so concurrency 8 is the best point): per point, 3 stable windows of N requests each. A request's latency
is drawn from a known distribution (an exponential tail over a fixed service time, a lognormal, a gamma); a window's
speed varies by a known CV (its throughput is T / g, its latencies x g), and a run's by a smaller run-to-run CV. The
point's row carries what the loader reads: throughput (the merged windows' requests over their time), p50..p99 of the
merged requests by perf_analyzer's rank rule, the mean latency, window_requests, and the windows' CVs, which go
through the project's own `with_noise` (as `load_run` does with a log's Pass lines) and then `compare_runs`,
unchanged.

- aa_false_regression: baseline and candidate from one truth; share of comparisons whose verdict is regression.
- found_10pct: the candidate's throughput 10% lower at every point (latencies unchanged), or its latencies beyond the
  true p90 stretched so the true p99 is 10% higher (the mean barely moves): share judged a regression, over the
  conditions where `resolvable` (the p99's own standard error, ~sqrt(2) x 2.33 + 1.64 of which a 10% change must
  exceed, and the window CV allow it); every condition's share is in `by_condition`.
- lost_point_flagged: the candidate's point error / behind / unstable / undetermined / absent; share whose exit code
  is 1 or 2 and whose summary names the point (a lost best point must give 1: `lost_best_is_regression`).

Usage: .venv/bin/python benchmarks/calibration_compare.py [--seed 0] [--scale 1.0]   (prints the JSON; writes nothing)
`calibrate()` is what benchmarks/calibration.py imports.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # standalone: the repository's tbench

from tbench.loadgen.perf_analyzer import STABLE_WINDOWS, Noise  # noqa: E402
from tbench.results import compare  # noqa: E402
from tbench.results.compare import (  # noqa: E402
    EXIT_CODES,
    REGRESSION,
    RunResults,
    compare_runs,
    verdict_exit_code,
    with_noise,
)

CONCURRENCY = np.array([1, 2, 4, 8])
SPEEDUP = np.array([1.0, 1.8, 2.5, 2.9])  # throughput relative to concurrency 1: concurrency 8 is the best point
BASE_RATE = 400.0  # infer/s at concurrency 1
PERCENTILES = (50, 90, 95, 99)
RESULT_VALUES = ("throughput_infer_per_s", "avg_ms", *(f"p{p}_ms" for p in PERCENTILES))
LOST_STATUSES = ("error", "behind", "unstable", "undetermined", "absent")


@dataclass(frozen=True)
class Condition:
    latency: str  # the distribution's name (LATENCIES)
    requests: int  # per window
    window_cv: float  # of a window's speed
    run_cv: float = 0.005  # of a run's speed (run to run)

    @property
    def name(self) -> str:
        return f"{self.latency} N={self.requests} window_cv={self.window_cv:g} run_cv={self.run_cv:g}"


# latency in ms at concurrency 1 (scaled by concurrency / speed-up: a closed loop's latency is concurrency / rate)
LATENCIES = {
    "exp_tail": lambda rng, size: 2.0 + rng.exponential(0.5, size),  # service + exponential queueing tail
    "lognormal_0.25": lambda rng, size: 2.5 * rng.lognormal(0.0, 0.25, size),
    "lognormal_0.5": lambda rng, size: 2.5 * rng.lognormal(0.0, 0.5, size),  # a heavy tail
    "gamma_16": lambda rng, size: rng.gamma(16.0, 2.5 / 16.0, size),  # CV 0.25
}
CONDITIONS = [
    Condition(latency, requests, window_cv)
    for latency in LATENCIES
    for requests in (100, 500, 2000)
    for window_cv in (0.01, 0.03)
]


def _rank_percentiles(latencies: np.ndarray) -> dict[int, np.ndarray]:
    """perf_analyzer's percentiles of each row: the sorted latencies at index p/100 x (n - 1), rounded."""
    ordered = np.sort(latencies, axis=-1)
    n = ordered.shape[-1]
    return {p: ordered[..., int(p / 100 * (n - 1) + 0.5)] for p in PERCENTILES}


def _true_quantiles(latency: str, qs: tuple[float, ...]) -> np.ndarray:
    sample = LATENCIES[latency](np.random.default_rng(12345), 2_000_000)
    return np.quantile(sample, qs)


def simulate_runs(rng, cond: Condition, trials: int, throughput_factor: float = 1.0, p99_rise: float = 0.0) -> dict:
    """`trials` runs of the sweep under `cond`: arrays (trials, points) of what each point's row holds."""
    shape = (trials, len(CONCURRENCY), STABLE_WINDOWS)
    run = 1.0 + cond.run_cv * rng.standard_normal((trials, 1, 1))
    speed = run * (1.0 + cond.window_cv * rng.standard_normal(shape))  # > 1: slower
    window_tput = throughput_factor * BASE_RATE * SPEEDUP[None, :, None] / speed
    latencies = LATENCIES[cond.latency](rng, (*shape, cond.requests))
    if p99_rise:  # stretch the tail beyond the true p90 so the true p99 moves by p99_rise
        q90, q99 = _true_quantiles_cached(cond.latency, (0.90, 0.99))
        latencies = latencies + p99_rise * q99 * np.clip((latencies - q90) / (q99 - q90), 0.0, None)
    latencies = latencies * (speed * (CONCURRENCY / SPEEDUP)[None, :, None])[..., None]
    merged = latencies.reshape(trials, len(CONCURRENCY), -1)
    window_avg = latencies.mean(axis=-1)
    out = {f"p{p}_ms": v for p, v in _rank_percentiles(merged).items()}
    out["avg_ms"] = merged.mean(axis=-1)
    # perf_analyzer's throughput: the merged windows' requests over their summed time
    out["throughput_infer_per_s"] = STABLE_WINDOWS / (1.0 / window_tput).sum(axis=-1)
    out["throughput_cv"] = window_tput.std(axis=-1, ddof=1) / window_tput.mean(axis=-1)
    out["latency_cv"] = window_avg.std(axis=-1, ddof=1) / window_avg.mean(axis=-1)
    return out


def as_run(sim: dict, trial: int, name: str, cond: Condition, lost: tuple[int, str] | None = None) -> RunResults:
    """One trial's run as the loader returns it: the result rows, then the noise columns by the project's code."""
    rows = pd.DataFrame(
        {
            "model": "sim",
            "model_size": "small",
            "format": "onnx",
            "scenario": "online",
            "precision": "FP32",
            "gpu": "SIM",
            "batch_size": 1,
            "concurrency": CONCURRENCY.astype(float),
            "request_rate": np.nan,
            "request_distribution": None,
            "status": "ok",
            "error": None,
            "source_file": [f"perf/sim_c{c}_try0.csv" for c in CONCURRENCY],
            "window_requests": float(cond.requests),
            **{col: sim[col][trial] for col in RESULT_VALUES},
        }
    )
    cvs = zip(sim["throughput_cv"][trial], sim["latency_cv"][trial])
    noise = [Noise(t, lat, STABLE_WINDOWS, False) for t, lat in cvs]
    if lost is not None:
        point, status = lost
        if status == "absent":
            rows, noise = rows.drop(index=point).reset_index(drop=True), noise[:point] + noise[point + 1 :]
        else:
            rows.loc[point, ["status", "error", "throughput_infer_per_s"]] = [status, f"simulated {status}", np.nan]
            noise[point] = Noise(math.nan, math.nan, 0, False)
    return RunResults(name, name, with_noise(rows, noise))


def resolvable(cond: Condition) -> dict[str, bool]:
    """Whether a 10% change can be found at 95% while the A/A rate stays ~0.1% per metric: 10% must exceed
    (k + 1.64) x the change's noise, for throughput the windows' CV, for p99 its standard error at n requests."""
    q95, q99 = _true_quantiles_cached(cond.latency, (0.95, 0.99))
    n = STABLE_WINDOWS * cond.requests
    p99_se = compare.p99_standard_error(q95, q99, cond.requests)
    noise = math.hypot(cond.window_cv, cond.run_cv)
    reach = 3.0 + 1.645
    return {
        "throughput": reach * math.sqrt(2) * noise <= 0.10,
        "p99": n >= compare.MIN_P99_REQUESTS and reach * math.sqrt(2) * max(p99_se, noise) <= 0.10,
    }


def _regressed(base: RunResults, cand: RunResults) -> bool:
    return compare_runs(base, cand).verdict == REGRESSION


def _named(summary: str, concurrency: int) -> bool:
    return f"concurrency {concurrency}" in summary


def lost_points(rng, trials: int) -> dict:
    """Every lost status at every point: exit 1 or 2 and the point named; a lost best point (concurrency 8): exit 1."""
    cond = Condition("exp_tail", 500, 0.01)
    flagged, best_regressed, cases = 0, 0, 0
    for _ in range(trials):
        sim = simulate_runs(rng, cond, 2)
        base = as_run(sim, 0, "base", cond)
        for point in range(len(CONCURRENCY)):
            for status in LOST_STATUSES:
                c = compare_runs(base, as_run(sim, 1, "cand", cond, lost=(point, status)))
                code = verdict_exit_code(c)
                cases += 1
                flagged += code in (1, 2) and _named(c.summary, int(CONCURRENCY[point]))
                if point == len(CONCURRENCY) - 1 and status != "absent":
                    best_regressed += code == EXIT_CODES[REGRESSION]
    best_cases = trials * (len(LOST_STATUSES) - 1)
    return {
        "lost_point_flagged": flagged / cases,
        "lost_best_is_regression": best_regressed / best_cases,
        "cases": cases,
    }


@functools.cache
def _true_quantiles_cached(latency: str, qs: tuple[float, ...]) -> np.ndarray:
    return _true_quantiles(latency, qs)


def _share(pairs) -> float:
    return float(np.mean([_regressed(b, c) for b, c in pairs])) if pairs else math.nan


def calibrate(seed: int = 0, scale: float = 1.0) -> dict:
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    trials = max(10, int(round(40 * scale)))  # per condition, A/A and each resolvable planted change
    by_condition, aa, found = [], [], {"throughput": [], "p99": []}
    for cond in CONDITIONS:
        can = resolvable(cond)
        first = simulate_runs(rng, cond, trials)
        base = [as_run(first, t, "base", cond) for t in range(trials)]
        again = simulate_runs(rng, cond, trials)
        aa_share = _share([(b, as_run(again, t, "again", cond)) for t, b in enumerate(base)])
        planted = {"throughput": {"throughput_factor": 0.9}, "p99": {"p99_rise": 0.10}}
        shares = {}
        for metric, change in planted.items():  # only where the change is resolvable: the goal's conditions
            if can[metric]:
                sim = simulate_runs(rng, cond, trials, **change)
                shares[metric] = _share([(b, as_run(sim, t, metric, cond)) for t, b in enumerate(base)])
                found[metric].append(shares[metric])
        aa.append(aa_share)
        by_condition.append(
            {
                "condition": cond.name,
                "aa_false_regression": round(aa_share, 4),
                **{f"found_10pct_{m}": round(v, 4) for m, v in shares.items()},
                "resolvable": can,
            }
        )
    lost = lost_points(rng, max(4, int(round(10 * scale))))
    all_found = found["throughput"] + found["p99"]
    return {
        "rules": {
            "compare": {
                "aa_false_regression": round(float(np.mean(aa)), 4),
                "aa_false_regression_worst_condition": round(float(np.max(aa)), 4),
                "found_10pct": round(float(np.mean(all_found)), 4),
                "found_10pct_throughput": round(float(np.mean(found["throughput"])), 4),
                "found_10pct_p99": round(float(np.mean(found["p99"])), 4),
                "found_10pct_worst_resolvable_condition": round(float(np.min(all_found)), 4),
                **{k: round(v, 4) if isinstance(v, float) else v for k, v in lost.items()},
                "by_condition": by_condition,
                "seconds": round(time.perf_counter() - started, 1),
            }
        },
        "conditions": {
            "compare": {
                "sweep": f"one format x scenario, concurrency {CONCURRENCY.tolist()} (throughput x {SPEEDUP.tolist()}; "
                f"concurrency 8 the best point), {STABLE_WINDOWS} stable windows per point",
                "latency_distributions": {
                    "exp_tail": "2 ms + Exp(0.5 ms)",
                    "lognormal_0.25": "2.5 ms x LogNormal(0, 0.25)",
                    "lognormal_0.5": "2.5 ms x LogNormal(0, 0.5)",
                    "gamma_16": "Gamma(16, 2.5/16 ms)",
                },
                "requests_per_window": sorted({c.requests for c in CONDITIONS}),
                "window_cv": sorted({c.window_cv for c in CONDITIONS}),
                "run_cv": sorted({c.run_cv for c in CONDITIONS}),
                "trials_per_condition": trials,
                "conditions": len(CONDITIONS),
                "planted": "throughput x 0.9 at every point (latencies unchanged); or latencies beyond the true p90 "
                "stretched so the true p99 is +10% at every point",
                "found_10pct_over": "conditions where the change is resolvable: 10% >= (k + 1.645) x sqrt(2) x the "
                "metric's own noise (window CV; for p99 the larger of it and the p99's standard error at n requests, "
                f"n >= {compare.MIN_P99_REQUESTS}); every condition's share is in rules.compare.by_condition",
                "lost_statuses": list(LOST_STATUSES),
                "lost_trials": lost["cases"],
                "seed": seed,
                "scale": scale,
            }
        },
        "parameters": {
            "compare": {
                "min_effect": 0.05,
                "k": 3.0,
                "min_p99_requests": compare.MIN_P99_REQUESTS,
                "p99_z": compare.P99_Z,
                "stable_windows": STABLE_WINDOWS,
                "default_noise": compare.DEFAULT_NOISE,
            }
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    print(json.dumps(calibrate(args.seed, args.scale), indent=2))


if __name__ == "__main__":
    main()
