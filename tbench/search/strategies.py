"""Configuration search under a latency budget: pure logic, no Prefect and no server.

A `SearchSpace` is a grid of model configurations (`Candidate`: format x instance count x max batch x preferred
batch sizes x queue delay). An `Objective` says what is best: the highest throughput with p99 under a budget, or the
lowest p99 with throughput above a floor. An `Evaluator` measures one candidate (a real Triton server, or a simulated
response surface) and returns an `Observation`. `exhaustive_search` measures the whole grid; `smart_search` measures
at most `budget_fraction` of it. Both write every observation to a `Checkpoint` (JSON lines, fsync'ed) as soon as it
is measured, and a search started on an existing checkpoint measures only what it does not hold (resume). Both end
with a confirmation (tbench.search.confirm): what the windows could not separate is measured again, a few candidates
for a round or two, and each candidate's measurements are combined before the final selection.
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, Field

from tbench.core.registry import Registry
from tbench.search.checkpoint import Checkpoint  # noqa: F401  (re-exported)
from tbench.search.confirm import (  # noqa: F401  (re-exported)
    CONFIRM_ROUNDS,
    CONFIRM_WIDTH,
    SMART_CONFIRM_ROUNDS,
    ConfirmationRound,
    combine,
    confirm,
)
from tbench.search.objective import (  # noqa: F401  (re-exported: the search's names are importable from here)
    FEASIBLE_K,
    TIE_K,
    TIE_MARGIN,
    Objective,
    Observation,
    Selection,
    pooled_noise,
    select,
)
from tbench.search.space import (  # noqa: F401  (re-exported)
    PREFERRED_RULES,
    Candidate,
    SearchSpace,
    preferred_label,
    resolve_preferred,
)

OnObservation = Callable[["Observation", int, int], None]  # (observation, measured so far, planned measurements)


class Evaluator(Protocol):
    """Measures a candidate; a re-measurement is the same call (an evaluator may also take `confirm_round`, the
    confirmation round it measures for, to keep that measurement's files apart, and `read_back(observation)`, told of
    each measurement a resumed search reads from its checkpoint)."""

    def evaluate(self, candidate: Candidate) -> Observation: ...


class SearchResult(BaseModel):
    strategy: str
    objective: Objective
    grid_size: int
    budget: int = Field(description="The most candidates the strategy may measure.")
    observations: list[Observation] = Field(description="Every candidate the search looked at, in order.")
    new_measurements: int = Field(0, description="Measured by this run; the rest came from the checkpoint.")
    confirmation: list[ConfirmationRound] = Field(
        default_factory=list, description="The confirmation rounds: the candidates re-measured and their windows."
    )
    seconds: float = 0.0

    @property
    def measured(self) -> int:
        return len(self.observations)

    @property
    def remeasurements(self) -> int:
        """The confirmation's measurements (beyond the `measured` candidates' first ones)."""
        return sum(len(r.remeasured) for r in self.confirmation)

    @property
    def measured_fraction(self) -> float:
        return self.measured / self.grid_size if self.grid_size else 0.0

    @property
    def pooled(self) -> dict[str, float | None]:
        return pooled_noise(self.observations)

    def feasible(self) -> list[Observation]:
        """Feasible observations (by FEASIBLE_K standard errors), best first."""
        pooled = self.pooled
        return sorted(
            (o for o in self.observations if self.objective.feasible(o, pooled)), key=self.objective.value, reverse=True
        )

    @property
    def selection(self) -> Selection:
        """The verdict: the best configuration, whether the windows could decide it, and why (objective.select)."""
        return select(self.objective, self.observations, self.grid_size)

    @property
    def best(self) -> Observation | None:
        """The chosen configuration: the measured best feasible one, or the cheapest of those shown equal to it
        (fewest instances, then the smallest max batch, fewest preferred sizes and shortest queue delay)."""
        return self.selection.best

    def closest(self) -> Observation | None:
        """The best-ranked observation, feasible or not (the least violation when none is feasible)."""
        return max(self.observations, key=self.objective.rank, default=None)

    def to_markdown(self, title: str = "Configuration search", plot: str | None = None) -> str:
        selection = self.selection
        best = selection.best
        lines = [
            f"## {title}",
            "",
            f"Strategy **{self.strategy}**; objective: {self.objective.describe()}.",
            "",
            f"Measured **{self.measured} of {self.grid_size}** configurations "
            f"({100 * self.measured_fraction:.1f}% of the grid; "
            f"budget {self.budget}); {self.new_measurements} measured by this run, "
            f"{self.measured - self.new_measurements} read back from the checkpoint; {self.seconds:.1f} s.",
            "",
        ]
        if best is not None:
            lines += [
                f"**Best configuration**: {best.candidate.describe()}"
                + (f" at {best.concurrency} concurrent clients" if best.concurrency else "")
                + f": **{best.throughput:.1f} infer/s**, p99 {best.p99_ms:.2f} ms.",
                "",
                _verdict_line(selection),
                "",
            ]
        if self.confirmation:
            lines += [_confirmation_line(self.confirmation), ""]
        if best is None:  # with or without a confirmation round: one that left nothing feasible says so too
            near = self.closest()
            lines += [
                "**No measured configuration meets the objective.**"
                + (
                    f" Closest: {near.candidate.describe()} ({near.throughput:.1f} infer/s, p99 {near.p99_ms:.2f} ms)."
                    if near is not None and near.ok
                    else ""
                ),
                "",
            ]
        top = self.feasible()[:10]
        if top:
            lines += ["### Top feasible configurations", "", _table(top), ""]
        pooled = self.pooled
        infeasible = sum(1 for o in self.observations if o.ok and not self.objective.feasible(o, pooled))
        failed = [o for o in self.observations if not o.ok]
        lines.append(
            f"Feasible: {len(self.feasible())}; over the limit: {infeasible}; failed or unstable: {len(failed)}."
        )
        for o in failed[:10]:
            lines.append(f"- {o.candidate.key}: {o.status} {o.error}".rstrip())
        if plot:
            lines += ["", f"![throughput vs p99]({plot})"]
        return "\n".join(lines) + "\n"

    def plot(self, path: str | Path) -> Path:
        """Throughput against p99 for every measured candidate, the budget (or floor) and the chosen point marked."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ok = [o for o in self.observations if o.ok]
        pooled = self.pooled
        for feasible, style in (
            (True, dict(color="#76b900", label="feasible")),
            (False, dict(color="#999999", label="infeasible")),
        ):
            pts = [o for o in ok if self.objective.feasible(o, pooled) == feasible]
            if pts:
                ax.scatter([o.p99_ms for o in pts], [o.throughput for o in pts], s=22, alpha=0.8, **style)
        if self.objective.p99_budget_ms is not None:
            ax.axvline(
                self.objective.p99_budget_ms,
                color="red",
                linestyle="--",
                label=f"p99 budget {self.objective.p99_budget_ms:g} ms",
            )
        if self.objective.throughput_floor is not None:
            ax.axhline(
                self.objective.throughput_floor,
                color="red",
                linestyle="--",
                label=f"floor {self.objective.throughput_floor:g}/s",
            )
        best = self.best
        if best is not None:
            ax.scatter([best.p99_ms], [best.throughput], marker="*", s=220, color="black", zorder=5, label="chosen")
            ax.annotate(
                best.candidate.key,
                (best.p99_ms, best.throughput),
                textcoords="offset points",
                xytext=(6, 6),
                fontsize=7,
            )
        ax.set(
            xlabel="p99 latency (ms)",
            ylabel="Inferences/second",
            title=f"{self.strategy} search: {self.measured}/{self.grid_size} measured",
        )
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _verdict_line(selection: Selection) -> str:
    """How sure the choice is: decided, a tie, or undetermined with the configurations the windows cannot separate."""
    text = f"Verdict: **{selection.verdict}**: {selection.reason}."
    if selection.contenders:
        text += " Not separated from it: " + "; ".join(o.candidate.key for o in selection.contenders[:5])
        text += " ..." if len(selection.contenders) > 5 else "."
    if selection.near_limit:
        text += f" {len(selection.near_limit)} configuration(s) meet the limit on their estimate but not by its noise."
    return text


def _confirmation_line(rounds: list[ConfirmationRound]) -> str:
    """What the confirmation re-measured, round by round, and the windows each re-measured candidate rests on."""
    total = sum(len(r.remeasured) for r in rounds)
    text = f"Confirmation: {len(rounds)} round(s), {total} re-measurement(s)"
    read = sum(r.from_checkpoint for r in rounds)
    text += f" ({read} read back from the checkpoint)." if read else "."
    for r in rounds:
        why = f" ({r.verdict_before}: {r.reason})" if r.verdict_before else ""
        measured = ", ".join(f"{k} ({r.windows.get(k, '?')} windows)" for k in r.remeasured)
        failed = "".join(f"; {k} failed: {why_}" for k, why_ in r.failed.items())
        text += f"\n- round {r.round}{why}: {measured}{failed}"
    return text


def _table(observations: list[Observation]) -> str:
    header = (
        "| # | format | instances | max batch | preferred | queue delay (us) | clients | throughput (infer/s) | "
        "p99 (ms) | windows |"
    )
    rows = [header, "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for i, o in enumerate(observations, 1):
        c = o.candidate
        pref = ",".join(map(str, c.preferred_batch_sizes)) or "none"
        rows.append(
            f"| {i} | {c.format or '-'} | {c.instances} | {c.max_batch_size} | {pref} | {c.queue_delay_us} | "
            f"{o.concurrency or '-'} | {o.throughput:.1f} | {o.p99_ms:.2f} | {o.windows} |"
        )
    return "\n".join(rows)


class BudgetSpent(Exception):
    """The strategy asked for one measurement more than its budget allows."""


class _Session:
    """Measures candidates for a strategy: from the checkpoint when it holds them, else through the evaluator
    (and appended to the checkpoint at once); counts what the strategy looked at against its budget. A confirmation
    round's re-measurements (`remeasure`) are checkpoint lines of their own, tagged with the round; a candidate's
    observation is then its measurements combined (tbench.search.confirm.combine)."""

    def __init__(
        self, evaluator: Evaluator, checkpoint: Checkpoint | None, limit: int, on_observation: OnObservation | None
    ):
        self.evaluator, self.checkpoint, self.limit, self.on_observation = evaluator, checkpoint, limit, on_observation
        self.stored: dict[str, Observation] = {}  # the first measurement of each candidate the checkpoint holds
        self.stored_again: dict[tuple[str, int], Observation] = {}  # (key, round) -> its re-measurement
        for o in checkpoint.load() if checkpoint else []:
            if o.confirm_round:
                self.stored_again.setdefault((o.candidate.key, o.confirm_round), o)
            else:
                self.stored.setdefault(o.candidate.key, o)
        self.seen: dict[str, Observation] = {}  # what the strategy saw: first measurements (its path depends on them)
        self.again: dict[str, list[Observation]] = {}  # re-measurements, in round order
        self.new = self.new_again = self.read_back = 0
        self.confirmation: list[ConfirmationRound] = []

    def known(self, c: Candidate) -> Observation | None:
        return self.seen.get(c.key)

    def measure(self, c: Candidate) -> Observation:
        if c.key in self.seen:
            return self.seen[c.key]
        if len(self.seen) >= self.limit:
            raise BudgetSpent
        obs = self.stored.get(c.key)
        if obs is None:
            obs = self.evaluator.evaluate(c)
            if self.checkpoint is not None:
                self.checkpoint.append(obs)
            self.new += 1
        elif hasattr(self.evaluator, "read_back"):  # the next new candidate's load search starts from it
            self.evaluator.read_back(obs)
        self.seen[c.key] = obs
        if self.on_observation is not None:
            self.on_observation(obs, len(self.seen), self.limit)
        return obs

    def remeasure(self, c: Candidate, confirm_round: int) -> Observation:
        """The candidate measured again, by the evaluator's own call, in a confirmation round."""
        obs = self.stored_again.get((c.key, confirm_round))
        if obs is None:
            first = self.seen.get(c.key)  # measured again at the load it was first measured at: windows of one load
            load = first.concurrency if first is not None else None
            obs = _evaluate_again(self.evaluator, c, confirm_round, load).model_copy(
                update={"confirm_round": confirm_round}
            )
            if self.checkpoint is not None:
                self.checkpoint.append(obs)
            self.new_again += 1
        else:
            self.read_back += 1
        self.again.setdefault(c.key, []).append(obs)
        if self.on_observation is not None:
            self.on_observation(obs, len(self.seen), self.limit)
        return obs

    def observations(self) -> list[Observation]:
        """Every candidate looked at, in order, its re-measurements combined with its first measurement."""
        return [combine([o, *self.again.get(key, [])]) for key, o in self.seen.items()]

    def confirm(self, objective: Objective, rounds: int) -> None:
        self.confirmation = confirm(objective, self, rounds=rounds)

    def result(self, strategy: str, objective: Objective, grid_size: int, started: float) -> SearchResult:
        return SearchResult(
            strategy=strategy,
            objective=objective,
            grid_size=grid_size,
            budget=self.limit,
            observations=self.observations(),
            new_measurements=self.new,
            confirmation=self.confirmation,
            seconds=time.monotonic() - started,
        )


def _evaluate_again(evaluator: Evaluator, c: Candidate, confirm_round: int, load: int | None = None) -> Observation:
    """The evaluator's call for a re-measurement: told the round (a real evaluator keeps that measurement's files
    apart) and the load its first measurement chose (its windows pooled with that one's: not a new load search) where
    it takes them, else the plain call."""
    try:
        takes = inspect.signature(evaluator.evaluate).parameters
    except (TypeError, ValueError):
        takes = {}
    given = {"confirm_round": confirm_round, "load": load}
    return evaluator.evaluate(c, **{k: v for k, v in given.items() if k in takes and v is not None})


def exhaustive_search(
    space: SearchSpace,
    objective: Objective,
    evaluator: Evaluator,
    checkpoint: Checkpoint | None = None,
    on_observation: OnObservation | None = None,
    confirm_rounds: int = CONFIRM_ROUNDS,
) -> SearchResult:
    """Measure every candidate of the grid in grid order (those already in the checkpoint are read back), then
    confirm: re-measure what the windows could not separate, up to `confirm_rounds` rounds (tbench.search.confirm)."""
    started = time.monotonic()
    grid = space.grid()
    session = _Session(evaluator, checkpoint, len(grid), on_observation)
    for c in grid:
        session.measure(c)
    session.confirm(objective, confirm_rounds)
    return session.result("exhaustive", objective, len(grid), started)


def measurement_budget(grid_size: int, budget_fraction: float) -> int:
    """How many candidates a smart search may measure: the fraction of the grid, rounded down, at least 1."""
    return max(1, math.floor(budget_fraction * grid_size + 1e-9))


# The search visits the dimensions in order of how much they usually move throughput and latency.
SEARCH_ORDER = ("max_batch_size", "instances", "queue_delay_us", "preferred", "format")
ORDERED_AXES = ("max_batch_size", "instances", "queue_delay_us")  # the others are choices without an order
_GROWS_LATENCY = ("max_batch_size", "queue_delay_us")  # dimensions whose larger values batch more: p99 goes up


def smart_search(
    space: SearchSpace,
    objective: Objective,
    evaluator: Evaluator,
    checkpoint: Checkpoint | None = None,
    budget_fraction: float = 0.10,
    start: tuple[int, ...] | Candidate | None = None,
    on_observation: OnObservation | None = None,
    max_measurements: int | None = None,
    confirm_rounds: int = SMART_CONFIRM_ROUNDS,
) -> SearchResult:
    """Coordinate search from the guide's default (`start`, else the middle of the grid): max batch, instances, queue
    delay, preferred sizes and format are line-searched in turn, with steps that start at half the dimension's range
    and halve down to one grid step, moving whenever a point ranks better (feasible first, then throughput or
    latency) and pruning, unmeasured, what lies beyond a step up in batch or delay that pushed p99 over the budget (or
    a step down that dropped throughput under the floor).
    Passes repeat until none moves; then the rest of the budget refines around the best point (its unmeasured
    neighbours one step away in one or two dimensions, the passes restarting from any that improves), and no more than
    `budget_fraction` of the grid (or `max_measurements`) is ever measured. At the end, what the windows could not
    separate is re-measured, up to `confirm_rounds` rounds of a few candidates (tbench.search.confirm), beyond that
    budget.

    The search is deterministic given what it measures, so on a checkpoint it replays its path from the stored
    observations and measures only where it had not got to."""
    started = time.monotonic()
    grid = space.grid()
    limit = max_measurements if max_measurements is not None else measurement_budget(len(grid), budget_fraction)
    session = _Session(evaluator, checkpoint, min(limit, len(grid)), on_observation)
    if isinstance(start, Candidate):
        start = space.nearest(
            start.instances, start.max_batch_size, start.preferred_batch_sizes, start.queue_delay_us, start.format
        )
    try:
        _CoordinateSearch(space, objective, session).run(tuple(start) if start is not None else space.middle())
    except BudgetSpent:
        pass
    session.confirm(objective, confirm_rounds)
    return session.result("smart", objective, len(grid), started)


def _exhaustive(
    space: SearchSpace,
    objective: Objective,
    evaluator: Evaluator,
    checkpoint: Checkpoint | None = None,
    budget_fraction: float = 1.0,
    start: tuple[int, ...] | Candidate | None = None,
    on_observation: OnObservation | None = None,
    confirm_rounds: int = CONFIRM_ROUNDS,
) -> SearchResult:
    """exhaustive_search called as smart_search is: it has no budget and no start point, so it ignores them."""
    return exhaustive_search(
        space, objective, evaluator, checkpoint, on_observation=on_observation, confirm_rounds=confirm_rounds
    )


# The strategies by name, all called as smart_search is; their order is the one the search flow's field lists.
STRATEGIES: Registry[str, Callable[..., SearchResult]] = Registry("search strategy")
STRATEGIES.register("smart", smart_search)
STRATEGIES.register("exhaustive", _exhaustive)


class _CoordinateSearch:
    def __init__(self, space: SearchSpace, objective: Objective, session: _Session):
        self.space, self.objective, self.session = space, objective, session
        self.shape = dict(zip(SearchSpace.AXES, space.shape()))
        self.axis_pos = {a: i for i, a in enumerate(SearchSpace.AXES)}
        self.axes = [a for a in SEARCH_ORDER if self.shape[a] > 1]
        self.pruned: list[tuple[str, tuple[int, ...], int]] = []  # (axis, the point that crossed the limit, direction)
        self.best: tuple[int, ...] = space.middle()

    # -- measuring and comparing
    def obs(self, index: tuple[int, ...]) -> Observation:
        return self.session.measure(self.space.at(index))

    def better(self, a: tuple[int, ...], b: tuple[int, ...]) -> bool:
        return self.objective.rank(self.obs(a)) > self.objective.rank(self.obs(b))

    def step(self, index: tuple[int, ...], axis: str, delta: int) -> tuple[int, ...] | None:
        pos = self.axis_pos[axis]
        value = index[pos] + delta
        if not 0 <= value < self.shape[axis]:
            return None
        return index[:pos] + (value,) + index[pos + 1 :]

    # -- pruning
    def is_pruned(self, index: tuple[int, ...]) -> bool:
        """Beyond a step that crossed the limit: the same other coordinates, further along the same direction."""
        for axis, crossed, direction in self.pruned:
            pos = self.axis_pos[axis]
            if (
                all(index[i] == crossed[i] for i in range(len(index)) if i != pos)
                and (index[pos] - crossed[pos]) * direction > 0
            ):
                return True
        return False

    def note_crossing(self, frm: tuple[int, ...], to: tuple[int, ...], axis: str, direction: int) -> None:
        """Prune beyond `to` when the step frm -> to left the feasible region the way that only gets worse further
        on: a larger batch or delay that raised p99 over the budget, a smaller one that dropped throughput under
        the floor."""
        if axis not in _GROWS_LATENCY:
            return
        a, b = self.obs(frm), self.obs(to)
        if not (a.ok and b.ok) or self.objective.feasible(b) or not self.objective.feasible(a):
            return
        if self.objective.goal == "max_throughput":
            crossed = direction > 0 and b.p99_ms > a.p99_ms
        else:
            crossed = direction < 0 and b.throughput < a.throughput
        if crossed:
            self.pruned.append((axis, to, direction))

    # -- the strategy
    def directions(self, index: tuple[int, ...], axis: str) -> list[int]:
        """Ordered dimensions: towards bigger batches, delays and more instances first while feasible under a
        throughput objective (or while under the floor of a latency one), the other way otherwise. Choices: every
        other value, nearest first."""
        if axis not in ORDERED_AXES:
            here = index[self.axis_pos[axis]]
            return sorted((v - here for v in range(self.shape[axis]) if v != here), key=lambda d: (abs(d), -d))
        feasible = self.objective.feasible(self.obs(index))
        up_first = feasible if self.objective.goal == "max_throughput" else not feasible
        return [1, -1] if up_first else [-1, 1]

    def extend(self, axis: str, direction: int, stride: int) -> None:
        """Keep moving along a direction that just improved, while it improves."""
        while True:
            to = self.step(self.best, axis, direction * stride)
            if to is None or self.is_pruned(to):
                return
            frm = self.best
            if not self.better(to, frm):
                self.note_crossing(frm, to, axis, direction)
                return
            self.best = to

    def line_search(self, axis: str) -> bool:
        """Improve the best point along one dimension; True when it moved."""
        ordered = axis in ORDERED_AXES
        stride = max(1, (self.shape[axis] - 1) // 2) if ordered else 1
        moved_any = False
        while True:
            moved = False
            for direction in self.directions(self.best, axis):
                to = self.step(self.best, axis, direction * stride)
                if to is None or self.is_pruned(to):
                    continue
                frm = self.best
                if self.better(to, frm):
                    self.best, moved, moved_any = to, True, True
                    if ordered:
                        self.extend(axis, direction, stride)
                    break
                if ordered:
                    self.note_crossing(frm, to, axis, direction)
            if moved and ordered:
                continue  # poll again around the new best at the same step
            if stride == 1 or not ordered:
                return moved_any
            stride = max(1, stride // 2)

    def sweep(self) -> None:
        """Passes over the dimensions until a whole pass moves nothing."""
        while any([self.line_search(axis) for axis in self.axes]):
            pass

    def neighbours(self, index: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Unmeasured, unpruned points one step away in one dimension, then in two, in search order."""
        found: list[tuple[int, ...]] = []
        for axis in self.axes:
            found += [p for d in (1, -1) if (p := self.step(index, axis, d)) is not None]
        for a1, a2 in itertools.combinations(self.axes, 2):
            for d1, d2 in itertools.product((1, -1), repeat=2):
                p = self.step(index, a1, d1)
                p = self.step(p, a2, d2) if p is not None else None
                if p is not None:
                    found.append(p)
        seen, out = set(), []
        for p in found:
            key = self.space.at(p).key
            if key in seen or self.session.known(self.space.at(p)) is not None or self.is_pruned(p):
                continue
            seen.add(key)
            out.append(p)
        return out

    def run(self, start: tuple[int, ...]) -> None:
        self.best = start
        self.obs(start)
        while True:
            self.sweep()
            for p in self.neighbours(self.best):
                if self.better(p, self.best):
                    self.best = p
                    break
            else:
                return


def load_result(path: str | Path) -> list[Observation]:
    """The observations of a checkpoint file (a convenience for reports and notebooks)."""
    return Checkpoint(path).load()


def observations_json(observations: list[Observation]) -> str:
    return json.dumps([o.model_dump(mode="json") for o in observations], indent=2)
