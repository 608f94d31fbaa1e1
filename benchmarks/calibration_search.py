"""The search verdict against a known truth: how often the reported best configuration is within 2% of the truly best
one, and how often the chosen configuration's true p99 is over the budget.

Each trial draws a response surface over a grid (instances x max batch x preferred sizes x queue delay: throughput
grows with batch up to a saturation and with instances by n^eta; preferred sizes and the queue delay move it by a few
percent, which makes the near-ties that a real grid has; p99 = the closed loop's mean latency x a dispersion that grows
with the batch, + the queue delay), a p99 budget at a quantile of the grid's true p99s, and a measurement of every
candidate as perf_analyzer gives it: 3 windows with a window CV, their mean and CVs, and a p99 estimate whose error is
`tail` x CV / sqrt(3). The project's own search (`exhaustive_search`, unchanged) measures the grid through a simulated
evaluator (`SimulatedWindows`) and confirms: a re-measurement draws 3 new windows of the same candidate's truth (and a
new p99 estimate), and the search combines them with the earlier ones (tbench.search.confirm); its selection
(tbench.search.objective.select) picks the best. The same first draws are also scored without the confirmation
(`no_confirmation`: select on the first measurements alone) and by the rule of dd6368f (one window's CV as the tie
band, p99 <= budget on the estimate; re-implemented here), as `before`. `extra_measurements_*`: the re-measurements a
search made; `within_2pct_by_verdict`: how far each verdict can be trusted.

Usage: .venv/bin/python benchmarks/calibration_search.py   (prints the JSON; writes nothing)
"""

from __future__ import annotations

import json
import math
import sys
import time

import numpy as np

from tbench.search.confirm import CONFIRM_ROUNDS, CONFIRM_WIDTH
from tbench.search.objective import FEASIBLE_K, P99_TAIL, TIE_K, TIE_MARGIN, WINDOWS, select
from tbench.search.strategies import Candidate, Objective, Observation, SearchSpace, exhaustive_search

GRIDS = {
    "small": SearchSpace(
        instances=[1, 2], max_batch_sizes=[1, 2, 4, 8, 16], preferred=["none", "max"], queue_delays_us=[0, 500, 2000]
    ),
    "large": SearchSpace(
        instances=[1, 2, 3, 4],
        max_batch_sizes=[1, 2, 4, 8, 16, 32],
        preferred=["none", "max"],
        queue_delays_us=[0, 500, 2000],
    ),
}
GRIDS_BY_SIZE = {len(space.grid()): space for space in GRIDS.values()}
WINDOW_CVS = (0.01, 0.02, 0.04, 0.06)
TAILS = (1.0, 2.0)  # the p99 estimate's noise relative to the windows' mean-latency CV (the rule assumes P99_TAIL)
BUDGET_QUANTILES = (0.2, 0.4, 0.6)
CONCURRENCY = 16
TRIALS = 40  # per condition at scale 1


def grid_arrays(space: SearchSpace) -> dict[str, np.ndarray]:
    grid = space.grid()
    return {
        "candidates": np.array(grid, dtype=object),
        "n": np.array([c.instances for c in grid], float),
        "b": np.array([c.max_batch_size for c in grid], float),
        "pref": np.array([bool(c.preferred_batch_sizes) for c in grid], float),
        "d": np.array([c.queue_delay_us for c in grid], float),
    }


def true_surface(g: dict[str, np.ndarray], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(throughput, p99 ms) of every candidate under a random, plausible surface."""
    saturation = rng.uniform(2, 16)
    eta = rng.uniform(0.2, 0.9)
    batching = g["b"] / (1 + (g["b"] - 1) / saturation)
    pref = 1 + rng.uniform(-0.02, 0.03) * g["pref"] * (g["b"] > 1)
    delay = 1 + rng.uniform(0, 0.06) * np.log1p(g["d"] / 500) / np.log1p(4) * (g["b"] > 1)
    own = np.exp(rng.normal(0, 0.01, g["b"].size))
    throughput = 100 * g["n"] ** eta * batching * pref * delay * own
    # bigger batches and more instances widen the tail; a held batch's first request waits the whole delay
    dispersion = rng.uniform(1.3, 2.0) + rng.uniform(0.2, 0.8) * np.log(g["b"]) + rng.uniform(0, 0.3) * (g["n"] - 1)
    p99 = CONCURRENCY / throughput * 1000 * dispersion + rng.uniform(1, 3) * g["d"] / 1000
    return throughput, p99


def measured(throughput, p99, cv: float, tail: float, rng) -> dict[str, np.ndarray]:
    """What perf_analyzer reports: the mean of WINDOWS windows, their CVs (closed loop: latency = C / throughput), and
    a p99 estimate with its own sampling noise."""
    windows = throughput[:, None] * (1 + cv * rng.standard_normal((throughput.size, WINDOWS)))
    latency = CONCURRENCY / windows
    return {
        "throughput": windows.mean(1),
        "avg_ms": 1000 * latency.mean(1),
        "throughput_cv": windows.std(1, ddof=1) / windows.mean(1),
        "latency_cv": latency.std(1, ddof=1) / latency.mean(1),
        "p99_ms": p99 * np.exp(tail * cv / math.sqrt(WINDOWS) * rng.standard_normal(throughput.size)),
    }


def before_rule(objective: Objective, observations: list[Observation]) -> Observation | None:
    """dd6368f's choice: feasible on the p99 estimate, ties within TIE_K x one window's combined CV, cheapest wins."""
    feasible = sorted(
        (o for o in observations if o.p99_ms <= objective.p99_budget_ms), key=lambda o: o.throughput, reverse=True
    )
    if not feasible:
        return None
    top = feasible[0]
    tied = [
        o
        for o in feasible
        if top.throughput - o.throughput <= 2.0 * math.hypot(top.throughput_cv, o.throughput_cv) * top.throughput
    ]
    return min(tied, key=lambda o: (o.candidate.cost, -o.throughput))


def score(chosen: Observation | None, index: dict, throughput, p99, budget: float) -> tuple[bool, bool]:
    """(within 2% of the true best, over the budget) for one search's choice."""
    feasible = p99 <= budget
    true_best = throughput[feasible].max()
    if chosen is None:
        return False, False
    i = index[chosen.candidate.key]
    return bool(throughput[i] >= 0.98 * true_best), bool(p99[i] > budget)


class SimulatedWindows:
    """The search's evaluator over a drawn truth: a candidate's first measurement is the one drawn for every candidate
    at once (`measured`, so the rules without confirmation score the same draws); a re-measurement (a confirmation
    round) draws WINDOWS new windows of the same candidate's truth, from its own generator."""

    def __init__(self, g, index, throughput, p99, first: dict[str, np.ndarray], cv, tail, rng):
        self.g, self.index, self.throughput, self.p99 = g, index, throughput, p99
        self.first, self.cv, self.tail, self.rng = first, cv, tail, rng
        self.again = 0

    def observation(self, i: int, m: dict[str, np.ndarray], j: int) -> Observation:
        return Observation(
            candidate=self.g["candidates"][i],
            throughput=float(m["throughput"][j]),
            p99_ms=float(m["p99_ms"][j]),
            avg_ms=float(m["avg_ms"][j]),
            throughput_cv=float(m["throughput_cv"][j]),
            latency_cv=float(m["latency_cv"][j]),
        )

    def evaluate(self, candidate: Candidate, confirm_round: int = 0) -> Observation:
        i = self.index[candidate.key]
        if not confirm_round:
            return self.observation(i, self.first, i)
        self.again += 1
        return self.observation(
            i, measured(self.throughput[i : i + 1], self.p99[i : i + 1], self.cv, self.tail, self.rng), 0
        )


def trial(g, index, cv, tail, quantile, rng, again_rng) -> dict:
    throughput, p99 = true_surface(g, rng)
    budget = float(np.quantile(p99, quantile))
    m = measured(throughput, p99, cv, tail, rng)
    objective = Objective(p99_budget_ms=budget)
    evaluator = SimulatedWindows(g, index, throughput, p99, m, cv, tail, again_rng)
    result = exhaustive_search(GRIDS_BY_SIZE[len(index)], objective, evaluator)
    selection = result.selection
    first = [evaluator.observation(i, m, i) for i in range(len(index))]
    unconfirmed = select(objective, first)
    within, over = score(selection.best, index, throughput, p99, budget)
    old_within, old_over = score(before_rule(objective, first), index, throughput, p99, budget)
    first_within, first_over = score(unconfirmed.best, index, throughput, p99, budget)
    assert result.remeasurements == evaluator.again
    return {
        "within": within,
        "over": over,
        "verdict": selection.verdict,
        "extra": evaluator.again,
        "rounds": len(result.confirmation),
        "first_within": first_within,
        "first_over": first_over,
        "first_verdict": unconfirmed.verdict,
        "before_within": old_within,
        "before_over": old_over,
    }


def share(rows: list[dict], key: str, value=True) -> float:
    return round(float(np.mean([r[key] == value for r in rows])), 4) if rows else float("nan")


def summary(rows: list[dict]) -> dict:
    extra = [r["extra"] for r in rows] or [0]
    return {
        "within_2pct": share(rows, "within"),
        "over_budget": share(rows, "over"),
        "undetermined": share(rows, "verdict", "undetermined"),
        "tie": share(rows, "verdict", "tie"),
        "none_feasible": share(rows, "verdict", "none"),
        "extra_measurements_mean": round(float(np.mean(extra)), 2),
        "extra_measurements_max": int(max(extra)),
        "confirmed": round(1 - share(rows, "rounds", 0), 4),
        "within_2pct_by_verdict": {
            v: {"within_2pct": share(sub, "within"), "searches": len(sub)}
            for v in ("best", "tie", "undetermined")
            if (sub := [r for r in rows if r["verdict"] == v])
        },
        "no_confirmation": {
            "within_2pct": share(rows, "first_within"),
            "over_budget": share(rows, "first_over"),
            "undetermined": share(rows, "first_verdict", "undetermined"),
        },
        "before_within_2pct": share(rows, "before_within"),
        "before_over_budget": share(rows, "before_over"),
        "searches": len(rows),
    }


def calibrate(seed: int = 0, scale: float = 1.0) -> dict:
    started = time.monotonic()
    rng = np.random.default_rng(seed)
    trials = max(1, round(TRIALS * scale))
    rows: list[dict] = []
    for grid_name, space in GRIDS.items():
        g = grid_arrays(space)
        index = {c.key: i for i, c in enumerate(g["candidates"])}
        for cv in WINDOW_CVS:
            for tail in TAILS:
                for q in BUDGET_QUANTILES:
                    for _ in range(trials):
                        again = np.random.default_rng([seed, len(rows)])  # the re-measurements' own stream
                        row = trial(g, index, cv, tail, q, rng, again)
                        rows.append({"grid": grid_name, "cv": cv, "tail": tail, **row})
    by_cv = {f"{cv:g}": summary([r for r in rows if r["cv"] == cv]) for cv in WINDOW_CVS}
    by_tail = {f"{t:g}": summary([r for r in rows if r["tail"] == t]) for t in TAILS}
    return {
        "rules": {"search": {**summary(rows), "by_window_cv": by_cv, "by_p99_tail": by_tail}},
        "conditions": {
            "search": {
                "strategy": "exhaustive: every candidate measured once, then the confirmation's re-measurements "
                "(3 new windows of the candidate's truth each); the verdict is the selection rule's",
                "grids": {name: len(space.grid()) for name, space in GRIDS.items()},
                "window_cvs": list(WINDOW_CVS),
                "windows": WINDOWS,
                "p99_tail_factors": list(TAILS),
                "budget_quantiles_of_true_p99": list(BUDGET_QUANTILES),
                "surface": "throughput = 100 n^eta B/(1+(B-1)/h) x preferred (-2..+3%) x delay (0..+6%) x 1% own; "
                "eta U(0.2,0.9), h U(2,16); p99 = 16/throughput x (r0 + r1 ln B + r2 (n-1)) + w x delay, r0 U(1.3,2), "
                "r1 U(0.2,0.8), r2 U(0,0.3), w U(1,3)",
                "trials_per_condition": trials,
                "searches": len(rows),
                "seed": seed,
                "seconds": round(time.monotonic() - started, 1),
            }
        },
        "parameters": {
            "search": {
                "TIE_K": TIE_K,
                "TIE_MARGIN": TIE_MARGIN,
                "FEASIBLE_K": FEASIBLE_K,
                "P99_TAIL": P99_TAIL,
                "WINDOWS": WINDOWS,
                "CONFIRM_ROUNDS": CONFIRM_ROUNDS,
                "CONFIRM_WIDTH": CONFIRM_WIDTH,
            }
        },
    }


if __name__ == "__main__":
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    print(json.dumps(calibrate(scale=scale), indent=2))
