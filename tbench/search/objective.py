"""What a search is after and how its verdict is reached: one measured candidate (`Observation`), the goal and its
limit (`Objective`), and the choice of the best configuration from noisy measurements (`select` -> `Selection`).

Each measurement is the mean of perf_analyzer's last windows, so its noise is the windows' CV over the square root of
their count (the mean's standard error), not one window's CV. A candidate meets the limit only when it does by
FEASIBLE_K standard errors: the best of many candidates is otherwise, more often than not, one whose estimate fell
under the budget by chance. Two candidates tie only when their difference is shown to be small (TIE_MARGIN, the
difference's TIE_K-standard-error interval inside it). A candidate the windows cannot separate from the answer is
harmless when it is shown at most TIE_MARGIN better (the answer is then within the margin of it, whichever is ahead);
one that may be more than TIE_MARGIN better leaves the verdict "undetermined", with the contenders named, rather than a
silent pick. So does a leader whose noise is unknown (no windows' CV, its own or the search's): neither its lead nor
its limit can then be tested, only its estimates. A search measures those again before it settles
(tbench.search.confirm), and a measurement over more windows (`Observation.windows`, its measurements combined) has a
smaller standard error."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, model_validator

from tbench.search.space import Candidate

WINDOWS = 3  # perf_analyzer's stable windows a measurement averages (tbench.loadgen.perf_analyzer.STABLE_WINDOWS)
TIE_K = 2.0  # a difference counts as shown (or ruled out) at 2 standard errors of it
TIE_MARGIN = 0.02  # a tie: the objective's values shown to be within 2% of each other; then the cheaper one wins
FEASIBLE_K = 2.0  # the limit must hold at 2 standard errors of the p99 (or throughput) estimate
P99_TAIL = 2.0  # a window's p99 varies about twice as much as its mean latency (the log gives the mean's CV only)


class Observation(BaseModel):
    """One measured candidate; a failed or unstable measurement is kept with its status and no numbers."""

    candidate: Candidate
    throughput: float | None = Field(None, description="Inferences per second.")
    p99_ms: float | None = None
    avg_ms: float | None = None
    status: str = Field("ok", description="ok | unstable | error")
    error: str = ""
    seconds: float = Field(0.0, description="Wall time of the measurement (load + measure).")
    throughput_cv: float | None = Field(None, description="The throughput's noise: its CV over the stable windows.")
    latency_cv: float | None = Field(None, description="The latency's noise: its CV over the stable windows.")
    windows: int = Field(WINDOWS, ge=1, description="How many windows the figures are the mean of.")
    measurements: int = Field(
        1, ge=1, description="How many measurements (the first and its re-measurements) the figures combine."
    )
    confirm_round: int = Field(
        0,
        ge=0,
        description="0: measured by the search; r >= 1: re-measured in confirmation round r (tbench.search.confirm).",
    )
    concurrency: int | None = Field(
        None, ge=1, description="The closed-loop clients of its figures: the load searched, or the search's one."
    )

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.throughput is not None and self.p99_ms is not None


Pooled = dict[str, float | None]  # a search's median window CV per figure (pooled_noise)


def _known(cv: float | None) -> bool:
    return cv is not None and not math.isnan(cv)


def pooled_noise(observations: list[Observation]) -> dict[str, float | None]:
    """The median window CV of each figure over a search's measurements: a floor under any one candidate's CV, which
    three windows estimate poorly (a third of the time it is under half the true CV)."""
    pooled: dict[str, float | None] = {}
    for attr in ("throughput_cv", "latency_cv"):
        values = [getattr(o, attr) for o in observations if o.ok and _known(getattr(o, attr))]
        pooled[attr] = float(np.median(values)) if values else None
    return pooled


class Objective(BaseModel):
    """max_throughput: the highest throughput with p99 <= p99_budget_ms (no budget: unconstrained).
    min_latency: the lowest p99 with throughput >= throughput_floor (no floor: unconstrained)."""

    goal: Literal["max_throughput", "min_latency"] = "max_throughput"
    p99_budget_ms: float | None = Field(None, gt=0, description="max_throughput: the p99 latency budget, in ms.")
    throughput_floor: float | None = Field(
        None, ge=0, description="min_latency: the least acceptable throughput, infer/s."
    )

    @model_validator(mode="after")
    def _one_constraint(self) -> Objective:
        if self.goal == "max_throughput" and self.throughput_floor is not None:
            raise ValueError("max_throughput takes a p99 budget (p99_budget_ms), not a throughput floor")
        if self.goal == "min_latency" and self.p99_budget_ms is not None:
            raise ValueError("min_latency takes a throughput floor (throughput_floor), not a p99 budget")
        return self

    @staticmethod
    def standard_error(o: Observation, figure: str, pooled: Pooled | None = None) -> float | None:
        """The relative standard error of an observation's throughput or p99 (figure 'throughput' | 'p99'): its
        windows' CV (at least the search's pooled CV) over sqrt(windows); None when no noise is known."""
        attr = "throughput_cv" if figure == "throughput" else "latency_cv"
        known = [cv for cv in (getattr(o, attr), (pooled or {}).get(attr)) if _known(cv)]
        if not known:
            return None
        tail = P99_TAIL if figure == "p99" else 1.0
        return tail * max(known) / math.sqrt(o.windows)

    def feasible(self, o: Observation, pooled: Pooled | None = None) -> bool:
        """Within the limit by FEASIBLE_K standard errors (unknown noise: on the estimate alone)."""
        if not o.ok:
            return False
        if self.goal == "max_throughput":
            if self.p99_budget_ms is None:
                return True
            se = self.standard_error(o, "p99", pooled) or 0.0
            return o.p99_ms * (1 + FEASIBLE_K * se) <= self.p99_budget_ms
        if self.throughput_floor is None:
            return True
        se = self.standard_error(o, "throughput", pooled) or 0.0
        return o.throughput * (1 - FEASIBLE_K * se) >= self.throughput_floor

    def untested(self, o: Observation, pooled: Pooled | None = None) -> str:
        """The figures of `o` whose noise is unknown, the objective's and its limit's ('' when both are known): a
        verdict resting on them is the estimate's alone."""
        figures = ["throughput" if self.goal == "max_throughput" else "p99"]
        limit = self.p99_budget_ms if self.goal == "max_throughput" else self.throughput_floor
        if limit is not None:
            figures.append("p99" if self.goal == "max_throughput" else "throughput")
        return " and ".join(f for f in dict.fromkeys(figures) if self.standard_error(o, f, pooled) is None)

    def value(self, o: Observation) -> float:
        """Higher is better: throughput, or minus p99."""
        return o.throughput if self.goal == "max_throughput" else -o.p99_ms

    def value_error(self, o: Observation, pooled: Pooled | None = None) -> float | None:
        """The objective's relative standard error."""
        return self.standard_error(o, "throughput" if self.goal == "max_throughput" else "p99", pooled)

    def violation(self, o: Observation) -> float:
        """How far outside the constraint, relative (0 when feasible; inf when nothing was measured)."""
        if not o.ok:
            return math.inf
        if self.goal == "max_throughput":
            return 0.0 if self.p99_budget_ms is None else max(0.0, o.p99_ms / self.p99_budget_ms - 1)
        return 0.0 if not self.throughput_floor else max(0.0, 1 - o.throughput / self.throughput_floor)

    def compare(
        self, best: Observation, other: Observation, pooled: Pooled | None = None
    ) -> Literal["tie", "worse", "undetermined"]:
        """`other` against the measured leader `best`: 'worse' when its shortfall exceeds TIE_K standard errors of
        the difference, 'tie' when the difference is shown to be within TIE_MARGIN, else 'undetermined'. Unknown
        noise shows nothing: a shortfall is then taken at face value (worse), equality never."""
        errors = [self.value_error(o, pooled) for o in (best, other)]
        shortfall = (self.value(best) - self.value(other)) / abs(self.value(best))
        if any(e is None for e in errors):
            return "worse" if shortfall > 0 else "undetermined"
        se = math.hypot(*errors)
        if shortfall > TIE_K * se:
            return "worse"
        if abs(shortfall) + TIE_K * se <= TIE_MARGIN:
            return "tie"
        return "undetermined"

    def at_most_margin_better(self, answer: Observation, other: Observation, pooled: Pooled | None = None) -> bool:
        """Whether `other` is shown to be at most TIE_MARGIN better than `answer` (its excess, plus TIE_K standard
        errors of the difference, within the margin): then `answer` is within the margin of it, whichever is ahead."""
        errors = [self.value_error(o, pooled) for o in (answer, other)]
        if any(e is None for e in errors):
            return False
        excess = (self.value(other) - self.value(answer)) / abs(self.value(answer))
        return excess + TIE_K * math.hypot(*errors) <= TIE_MARGIN

    def within_noise(self, best: Observation, other: Observation, pooled: Pooled | None = None) -> bool:
        """Whether the windows cannot tell `other` from `best` (a tie or undetermined)."""
        return self.compare(best, other, pooled) != "worse"

    def rank(self, o: Observation) -> tuple[int, float]:
        """Sort key, larger is better: feasible before infeasible, then the objective's value, else the smaller
        violation (so a search can walk towards feasibility)."""
        if self.feasible(o):
            return (2, self.value(o))
        return (1, -self.violation(o)) if o.ok else (0, 0.0)

    def describe(self) -> str:
        if self.goal == "max_throughput":
            limit = f"p99 <= {self.p99_budget_ms:g} ms" if self.p99_budget_ms is not None else "no latency budget"
            return f"highest throughput with {limit}"
        limit = (
            f"throughput >= {self.throughput_floor:g} infer/s"
            if self.throughput_floor is not None
            else "no throughput floor"
        )
        return f"lowest p99 latency with {limit}"


Verdict = Literal["best", "tie", "undetermined", "none"]


@dataclass
class Selection:
    """The search's answer: `best` (None when nothing meets the limit), how sure it is (`verdict`: best -- the measured
    leader, every other behind it by more than the noise or shown at most TIE_MARGIN ahead of it; tie -- the cheapest
    of candidates shown equal; undetermined -- the measured leader, with `contenders` that may be more than TIE_MARGIN
    better than it, or with its noise unknown), and why, in a sentence. For best and tie, `contenders` are those it was
    not separated from."""

    best: Observation | None
    verdict: Verdict
    reason: str
    contenders: list[Observation] = field(default_factory=list)
    near_limit: list[Observation] = field(default_factory=list)  # within the limit, but not by FEASIBLE_K errors
    leader: Observation | None = None  # the feasible configuration measured best (`best` may be a cheaper tie)


def select(objective: Objective, observations: list[Observation], grid_size: int | None = None) -> Selection:
    """The best configuration of a search's observations (see the module docstring for the rules); of a grid of
    `grid_size` configurations, one measured alone is not called the best of it."""
    pooled = pooled_noise(observations)
    feasible = sorted((o for o in observations if objective.feasible(o, pooled)), key=objective.value, reverse=True)
    near = [o for o in observations if o.ok and objective.violation(o) == 0 and not objective.feasible(o, pooled)]
    if not feasible:
        reason = "no measured configuration meets the objective"
        if near:
            reason += f" by {FEASIBLE_K:g} standard errors ({len(near)} meet it on their estimate alone)"
        return Selection(None, "none", reason, near_limit=near)
    leader = feasible[0]
    if (grid_size or 0) > 1 and len({o.candidate for o in observations}) == 1:  # nothing to rank it against
        reason = (
            f"the only configuration measured of {grid_size}: nothing to compare it with (a larger budget_fraction, "
            "--budget-fraction, measures more)"
        )
        return Selection(leader, "undetermined", reason, near_limit=near, leader=leader)
    verdicts = {id(o): objective.compare(leader, o, pooled) for o in feasible[1:]}
    tied = [leader] + [o for o in feasible[1:] if verdicts[id(o)] == "tie"]
    best = min(tied, key=lambda o: (o.candidate.cost, -objective.value(o)))
    unseparated = [o for o in feasible[1:] if verdicts[id(o)] == "undetermined"]
    open_ = [o for o in unseparated if not objective.at_most_margin_better(best, o, pooled)]
    untested = objective.untested(best, pooled)
    if untested:  # its lead and its limit rest on the estimates alone
        reason = f"the measured best, untested: the windows' noise of its {untested} is unknown"
        return Selection(best, "undetermined", reason, contenders=unseparated, near_limit=near, leader=leader)
    if open_:
        se = objective.value_error(best, pooled)
        noise = f"{100 * se:.1f}%" if se is not None else "unknown"
        reason = (
            f"{len(open_)} other configuration(s) may be more than {100 * TIE_MARGIN:g}% better than it (its "
            f"standard error {noise}): the windows cannot decide"
        )
        return Selection(best, "undetermined", reason, contenders=open_, near_limit=near, leader=leader)
    within = f"; the {len(unseparated)} not separated from it are shown at most {100 * TIE_MARGIN:g}% better"
    if best is not leader:
        reason = f"the cheapest of {len(tied)} configurations shown within {100 * TIE_MARGIN:g}% of each other"
        reason += within if unseparated else ""
        others = [o for o in tied if o is not best] + unseparated
        return Selection(best, "tie", reason, contenders=others, near_limit=near, leader=leader)
    if unseparated:
        behind = len(feasible) - 1 - len(unseparated)
        reason = f"the measured best{within}" + (
            f"; {behind} other(s) behind it by more than the noise" if behind else ""
        )
        return Selection(best, "best", reason, unseparated, near, leader)
    return Selection(
        best, "best", "ahead of every other feasible configuration by more than the noise", [], near, leader
    )
