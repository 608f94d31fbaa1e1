"""`tbench compare` against a known truth: how often it calls two runs of one server a regression (A/A), how often it
finds a planted 10% throughput drop or 10% p99 rise, and whether a point the candidate lost ever passes, at the
run-to-run spreads real machines show.

Each simulated run is what perf_analyzer and the sweep report for an online sweep (concurrency 1, 2, 4, 8; one format
and scenario, so concurrency 8 is the best point), measured in one or more trials (each a server process of its own):
per point, 3 stable windows of N requests each. A request's latency is drawn from a known distribution (an exponential
tail over a fixed service time, a lognormal); a window's speed varies by a known CV (its throughput is T / g, its
latencies x g), and each trial's by the run-to-run spread: normal with a CV of 2, 5, 10 or 20%, or bimodal (a trial
is 15% slower half the time: where the OS put a thread). The point's rows carry what the loader reads: throughput
(the merged windows' requests over their time), p50..p99 of the merged requests by perf_analyzer's rank rule, the
mean latency, window_requests and the trial, and the windows' CVs, which go through the project's own `with_noise`
(as `load_run` does with a log's Pass lines) and then `compare_runs`, unchanged.

How the runs are compared (`MODES`): one trial each with the spread unknown (as a user runs it; nothing may be called a
regression); one trial each with the true spread stated (`--run-cv`); three trials each (the spread measured); and
the trials `RunSpread.trials_needed` asks for at the true spread to resolve 5% (where at most `MAX_ASKED`).

- aa_false_regression: baseline and candidate from one truth; share of comparisons whose verdict is regression, per
  run-to-run spread in `aa_false_regression_by_run_cv` (pooled over that spread's conditions and modes; the worst
  spread in `aa_false_regression_worst_run_cv`).
- found_10pct: the candidate's throughput 10% lower at every point (latencies unchanged), or its latencies beyond the
  true p90 stretched so the true p99 is 10% higher: share judged a regression, over the conditions and modes where
  `resolvable` (the tool's own threshold plus 1.645 standard errors within 10%); `found_10pct_asked`: the throughput
  drop with the trials the tool asks for.
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
from tbench.results.comparison import P99_Z  # noqa: E402
from tbench.results.run_noise import ALPHA, RunSpread  # noqa: E402

CONCURRENCY = np.array([1, 2, 4, 8])
SPEEDUP = np.array([1.0, 1.8, 2.5, 2.9])  # throughput relative to concurrency 1: concurrency 8 is the best point
BASE_RATE = 400.0  # infer/s at concurrency 1
PERCENTILES = (50, 90, 95, 99)
RESULT_VALUES = ("throughput_infer_per_s", "avg_ms", *(f"p{p}_ms" for p in PERCENTILES))
LOST_STATUSES = ("error", "behind", "unstable", "undetermined", "absent")


BIMODAL_GAP = 0.15  # a bimodal trial: this much slower, half the time
RUN_CVS = (0.02, 0.05, 0.10, 0.20, "bimodal")
MAX_ASKED = 12  # the most trials per run the harness follows the tool's advice to


@dataclass(frozen=True)
class Condition:
    latency: str  # the distribution's name (LATENCIES)
    requests: int  # per window
    window_cv: float  # of a window's speed
    run_cv: float | str = 0.05  # of a trial's speed (run to run), or "bimodal"

    @property
    def name(self) -> str:
        return f"{self.latency} N={self.requests} window_cv={self.window_cv:g} run_cv={self.run_cv}"

    @property
    def spread(self) -> float:
        """The trials' true CV: a bimodal trial is off by 0 or the gap, each half the time."""
        return BIMODAL_GAP / 2 if self.run_cv == "bimodal" else float(self.run_cv)

    def trial_speeds(self, rng, shape: tuple[int, ...]) -> np.ndarray:
        """Each trial's slowness factor (> 1: slower)."""
        if self.run_cv == "bimodal":
            return 1.0 + BIMODAL_GAP * rng.integers(0, 2, shape)
        return 1.0 + self.run_cv * rng.standard_normal(shape)


@dataclass(frozen=True)
class Mode:
    name: str
    trials: int  # per run; 0: the trials the tool asks for at the condition's true spread
    stated: bool = False  # the true spread given as --run-cv

    def trials_for(self, cond: Condition) -> int | None:
        if self.trials:
            return self.trials
        needed = RunSpread({"t": cond.spread}, measured=True).trials_needed("t", 0.05)  # as compare asks
        return needed if needed is not None and needed <= MAX_ASKED else None


MODES = (
    Mode("one trial, spread unknown", 1),
    Mode("one trial, spread stated", 1, stated=True),
    Mode("three trials", 3),
    Mode("the trials asked for", 0),
)


# latency in ms at concurrency 1 (scaled by concurrency / speed-up: a closed loop's latency is concurrency / rate)
LATENCIES = {
    "exp_tail": lambda rng, size: 2.0 + rng.exponential(0.5, size),  # service + exponential queueing tail
    "lognormal_0.5": lambda rng, size: 2.5 * rng.lognormal(0.0, 0.5, size),  # a heavy tail
}
CONDITIONS = [
    Condition(latency, 500, window_cv, run_cv)
    for latency in LATENCIES
    for window_cv in (0.01, 0.03)
    for run_cv in RUN_CVS
]


def _rank_percentiles(latencies: np.ndarray) -> dict[int, np.ndarray]:
    """perf_analyzer's percentiles of each row: the sorted latencies at index p/100 x (n - 1), rounded."""
    ordered = np.sort(latencies, axis=-1)
    n = ordered.shape[-1]
    return {p: ordered[..., int(p / 100 * (n - 1) + 0.5)] for p in PERCENTILES}


def _true_quantiles(latency: str, qs: tuple[float, ...]) -> np.ndarray:
    sample = LATENCIES[latency](np.random.default_rng(12345), 2_000_000)
    return np.quantile(sample, qs)


def simulate_runs(
    rng, cond: Condition, runs: int, trials: int = 1, throughput_factor: float = 1.0, p99_rise: float = 0.0
) -> dict:
    """`runs` runs of the sweep under `cond`, each in `trials` trials: arrays (runs, trials, points) of what each
    point's row holds."""
    shape = (runs, trials, len(CONCURRENCY), STABLE_WINDOWS)
    trial = cond.trial_speeds(rng, (runs, trials, 1, 1))
    speed = trial * (1.0 + cond.window_cv * rng.standard_normal(shape))  # > 1: slower
    window_tput = throughput_factor * BASE_RATE * SPEEDUP[None, None, :, None] / speed
    latencies = LATENCIES[cond.latency](rng, (*shape, cond.requests))
    if p99_rise:  # stretch the tail beyond the true p90 so the true p99 moves by p99_rise
        q90, q99 = _true_quantiles_cached(cond.latency, (0.90, 0.99))
        latencies = latencies + p99_rise * q99 * np.clip((latencies - q90) / (q99 - q90), 0.0, None)
    latencies = latencies * (speed * (CONCURRENCY / SPEEDUP)[None, None, :, None])[..., None]
    merged = latencies.reshape(runs, trials, len(CONCURRENCY), -1)
    window_avg = latencies.mean(axis=-1)
    out = {f"p{p}_ms": v for p, v in _rank_percentiles(merged).items()}
    out["avg_ms"] = merged.mean(axis=-1)
    # perf_analyzer's throughput: the merged windows' requests over their summed time
    out["throughput_infer_per_s"] = STABLE_WINDOWS / (1.0 / window_tput).sum(axis=-1)
    out["throughput_cv"] = window_tput.std(axis=-1, ddof=1) / window_tput.mean(axis=-1)
    out["latency_cv"] = window_avg.std(axis=-1, ddof=1) / window_avg.mean(axis=-1)
    return out


def as_run(sim: dict, run: int, name: str, cond: Condition, lost: tuple[int, str] | None = None) -> RunResults:
    """One run (every trial of it) as the loader returns it: the result rows, then the noise columns by the
    project's code; `lost`: (point, status) in every trial (a point the candidate no longer serves)."""
    trials = sim["avg_ms"].shape[1]
    frames, noise = [], []
    for t in range(trials):
        frames.append(
            pd.DataFrame(
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
                    "source_file": [f"perf/sim_c{c}_t{t}_try0.csv" for c in CONCURRENCY],
                    "window_requests": float(cond.requests),
                    "trial": t + 1,
                    **{col: sim[col][run, t] for col in RESULT_VALUES},
                }
            )
        )
        noise += [
            Noise(tp, lat, STABLE_WINDOWS, False)
            for tp, lat in zip(sim["throughput_cv"][run, t], sim["latency_cv"][run, t])
        ]
    rows = pd.concat(frames, ignore_index=True)
    if lost is not None:
        point, status = lost
        at = [t * len(CONCURRENCY) + point for t in range(trials)]
        if status == "absent":
            rows = rows[rows["concurrency"] != CONCURRENCY[point]].reset_index(drop=True)
            noise = [n for i, n in enumerate(noise) if i % len(CONCURRENCY) != point]
        else:
            rows.loc[at, ["status", "error", "throughput_infer_per_s"]] = [status, f"simulated {status}", np.nan]
            for row in at:
                noise[row] = Noise(math.nan, math.nan, 0, False)
    return RunResults(name, name, with_noise(rows, noise))


def resolvable(cond: Condition, trials: int, stated: bool) -> dict[str, bool]:
    """Whether a 10% change can be found at 95%: the tool's own threshold at the true spread (stated, or measured by
    the trials) plus 1.645 of the change's standard errors within 10%; for p99 also its standard error at n requests
    (each trial's)."""
    q95, q99 = _true_quantiles_cached(cond.latency, (0.95, 0.99))
    n = STABLE_WINDOWS * cond.requests
    p99_se = compare.p99_standard_error(q95, q99, cond.requests)
    spread = RunSpread({"t": cond.spread, "p": math.hypot(cond.spread, p99_se)}, measured=not stated)
    reach = {m: spread.threshold(m, trials, trials) + 1.645 * spread.cv[m] * math.sqrt(2 / trials) for m in "tp"}
    return {"throughput": reach["t"] <= 0.10, "p99": n >= compare.MIN_P99_REQUESTS and reach["p"] <= 0.10}


def _regressed(base: RunResults, cand: RunResults, run_cv: float | None = None) -> bool:
    return compare_runs(base, cand, run_cv=run_cv).verdict == REGRESSION


def _named(summary: str, concurrency: int) -> bool:
    return f"concurrency {concurrency}" in summary


def lost_points(rng, trials: int) -> dict:
    """Every lost status at every point: exit 1 or 2 and the point named; a lost best point (concurrency 8): exit 1.
    Three trials per run: the spread is measured, so nothing else is undetermined."""
    cond = Condition("exp_tail", 500, 0.01, 0.02)
    flagged, best_regressed, cases = 0, 0, 0
    for _ in range(trials):
        sim = simulate_runs(rng, cond, 2, 3)
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


def _share(base: list[RunResults], cand: list[RunResults], run_cv: float | None) -> float:
    return float(np.mean([_regressed(b, c, run_cv) for b, c in zip(base, cand)])) if base else math.nan


def _condition(rng, cond: Condition, mode: Mode, repeats: int) -> dict | None:
    """One condition in one mode: its A/A share and each resolvable planted change's share found."""
    trials = mode.trials_for(cond)
    if trials is None:
        return None
    stated = cond.spread if mode.stated else None
    base_sim = simulate_runs(rng, cond, repeats, trials)
    base = [as_run(base_sim, r, "base", cond) for r in range(repeats)]
    again = simulate_runs(rng, cond, repeats, trials)
    out = {
        "condition": cond.name,
        "mode": mode.name,
        "trials": trials,
        "aa_false_regression": _share(base, [as_run(again, r, "again", cond) for r in range(repeats)], stated),
    }
    can = (
        resolvable(cond, trials, mode.stated)
        if (mode.stated or trials > 1)
        else dict.fromkeys(("throughput", "p99"), False)
    )
    for metric, change in {"throughput": {"throughput_factor": 0.9}, "p99": {"p99_rise": 0.10}}.items():
        sim = simulate_runs(rng, cond, repeats, trials, **change)
        share = _share(base, [as_run(sim, r, metric, cond) for r in range(repeats)], stated)
        out[f"found_10pct_{metric}"] = share
        out[f"resolvable_{metric}"] = can[metric]
    return out


def calibrate(seed: int = 0, scale: float = 1.0) -> dict:
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    repeats = max(10, int(round(40 * scale)))  # comparisons per condition and mode, A/A and each planted change
    by_condition = [r for cond in CONDITIONS for mode in MODES if (r := _condition(rng, cond, mode, repeats))]
    by_cv = {  # pooled over the spread's conditions and modes: 40 comparisons a condition cannot show a 1% rate
        str(cv): round(
            float(np.mean([r["aa_false_regression"] for r in by_condition if r["condition"].endswith(f"run_cv={cv}")])),
            4,
        )
        for cv in RUN_CVS
    }
    found = [r[f"found_10pct_{m}"] for r in by_condition for m in ("throughput", "p99") if r[f"resolvable_{m}"]]
    asked = [
        r["found_10pct_throughput"] for r in by_condition if r["mode"] == MODES[3].name and r["resolvable_throughput"]
    ]
    unknown = [r for r in by_condition if r["mode"] == MODES[0].name]
    lost = lost_points(rng, max(4, int(round(10 * scale))))
    rounded = [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in by_condition]
    return {
        "rules": {
            "compare": {
                "aa_false_regression": round(float(np.mean([r["aa_false_regression"] for r in by_condition])), 4),
                "aa_false_regression_worst_run_cv": max(by_cv.values()),
                "aa_false_regression_worst_condition": round(max(r["aa_false_regression"] for r in by_condition), 4),
                "aa_false_regression_by_run_cv": by_cv,
                "found_10pct": round(float(np.mean(found)), 4),
                "found_10pct_worst_resolvable_condition": round(float(np.min(found)), 4),
                "found_10pct_asked": round(float(np.mean(asked)), 4),
                "unknown_spread_regression": round(
                    float(np.mean([max(r["aa_false_regression"], r["found_10pct_throughput"]) for r in unknown])), 4
                ),
                **{k: round(v, 4) if isinstance(v, float) else v for k, v in lost.items()},
                "by_condition": rounded,
                "seconds": round(time.perf_counter() - started, 1),
            }
        },
        "conditions": {
            "compare": {
                "sweep": f"one format x scenario, concurrency {CONCURRENCY.tolist()} (throughput x {SPEEDUP.tolist()}; "
                f"concurrency 8 the best point), {STABLE_WINDOWS} stable windows per point",
                "latency_distributions": {
                    "exp_tail": "2 ms + Exp(0.5 ms)",
                    "lognormal_0.5": "2.5 ms x LogNormal(0, 0.5)",
                },
                "requests_per_window": sorted({c.requests for c in CONDITIONS}),
                "window_cv": sorted({c.window_cv for c in CONDITIONS}),
                "run_cv": [str(cv) for cv in RUN_CVS],
                "bimodal": f"a trial {100 * BIMODAL_GAP:g}% slower half the time",
                "modes": [m.name for m in MODES],
                "max_trials_asked": MAX_ASKED,
                "comparisons_per_condition": repeats,
                "conditions": len(by_condition),
                "planted": "throughput x 0.9 at every point (latencies unchanged); or latencies beyond the true p90 "
                "stretched so the true p99 is +10% at every point",
                "found_10pct_over": "conditions and modes where the change is resolvable: the tool's threshold at the "
                "true spread plus 1.645 standard errors within 10% (for p99 with its standard error at n requests, "
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
                "alpha": ALPHA,
                "min_p99_requests": compare.MIN_P99_REQUESTS,
                "p99_z": P99_Z,
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
