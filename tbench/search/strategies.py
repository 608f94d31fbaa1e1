"""Configuration search under a latency budget: pure logic, no Prefect and no server.

A `SearchSpace` is a grid of model configurations (`Candidate`: format x instance count x max batch x preferred
batch sizes x queue delay). An `Objective` says what is best: the highest throughput with p99 under a budget, or the
lowest p99 with throughput above a floor. An `Evaluator` measures one candidate (a real Triton server, or a simulated
response surface) and returns an `Observation`. `exhaustive_search` measures the whole grid; `smart_search` measures
at most `budget_fraction` of it. Both write every observation to a `Checkpoint` (JSON lines, fsync'ed) as soon as it
is measured, and a search started on an existing checkpoint measures only what it does not hold (resume).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tbench.core.registry import Registry

# Preferred batch size rules, each resolved against a candidate's max batch size B.
PREFERRED_RULES = {
    "none": lambda b: [],  # no preferred sizes: Triton batches as large as it can, up to B
    "max": lambda b: [b],
    "half": lambda b: [b // 2, b],  # [B/2, B]
    "quarter": lambda b: [b // 4, b // 2, b],  # [B/4, B/2, B]
}

OnObservation = Callable[["Observation", int, int], None]  # (observation, measured so far, planned measurements)


def resolve_preferred(rule: str | list[int], max_batch_size: int) -> tuple[int, ...]:
    """A preferred-sizes rule ('none', 'max', 'half', 'quarter', or explicit sizes) as sizes for one max batch."""
    sizes = PREFERRED_RULES[rule](max_batch_size) if isinstance(rule, str) else list(rule)
    return tuple(sorted({s for s in sizes if 1 <= s <= max_batch_size}))


def preferred_label(rule: str | list[int]) -> str:
    return rule if isinstance(rule, str) else "[" + ",".join(map(str, rule)) + "]"


class Candidate(BaseModel):
    """One model configuration: what Triton's config.pbtxt says about scheduling, and which converted model."""

    model_config = ConfigDict(frozen=True)

    instances: int = Field(ge=1, description="Model instances (instance_group count).")
    max_batch_size: int = Field(ge=0, description="0: a model without a batch axis (SearchSpace.fitted_to).")
    preferred_batch_sizes: tuple[int, ...] = Field((), description="Dynamic batcher preferred sizes; () for none.")
    queue_delay_us: int = Field(0, ge=0, description="Dynamic batcher max_queue_delay_microseconds.")
    format: str = Field(
        "", description="The served variant: a format, or 'format:precision' when several precisions are converted."
    )

    @property
    def cost(self) -> tuple[int, int, int, int]:
        """What serving it takes, smallest first: instances (memory, devices), then max batch, preferred sizes and
        queue delay (latency a request may wait)."""
        return (self.instances, self.max_batch_size, len(self.preferred_batch_sizes), self.queue_delay_us)

    @property
    def key(self) -> str:
        """A stable, file-name-safe identifier: i2_b16_p8-16_d500[_onnx-fp16]."""
        pref = "-".join(map(str, self.preferred_batch_sizes)) or "none"
        key = f"i{self.instances}_b{self.max_batch_size}_p{pref}_d{self.queue_delay_us}"
        return f"{key}_{self.format.replace(':', '-')}" if self.format else key

    @property
    def format_name(self) -> str:
        return self.format.partition(":")[0]

    @property
    def precision(self) -> str:
        return self.format.partition(":")[2]

    def describe(self) -> str:
        pref = list(self.preferred_batch_sizes) if self.preferred_batch_sizes else "none"
        fmt = f", format {self.format}" if self.format else ""
        return (
            f"instances {self.instances}, max batch {self.max_batch_size}, preferred {pref}, "
            f"queue delay {self.queue_delay_us} us{fmt}"
        )


class SearchSpace(BaseModel):
    """The grid: every combination of the listed values (duplicates, such as 'half' and 'max' at max batch 1, once).
    Ordered dimensions are searched in order of their values; formats are unordered."""

    instances: list[int] = Field([1, 2], description="Instance counts to try.")
    max_batch_sizes: list[int] = Field([1, 2, 4, 8, 16], description="Max batch sizes to try.")
    preferred: list[str | list[int]] = Field(
        ["none", "max"],
        description="Preferred batch size choices: 'none', 'max' "
        "([B]), 'half' ([B/2, B]), 'quarter' ([B/4, B/2, B]) or explicit sizes.",
    )
    queue_delays_us: list[int] = Field([0, 500, 2000], description="Dynamic batcher max queue delays to try, in us.")
    formats: list[str] = Field(
        [""], description="Served variants: formats, or 'format:precision'; [''] for the one served model."
    )

    @field_validator("instances", "max_batch_sizes", "queue_delays_us")
    @classmethod
    def _sorted_unique(cls, values: list[int]) -> list[int]:
        if not values:
            raise ValueError("needs at least one value")
        return sorted(set(values))

    @field_validator("preferred")
    @classmethod
    def _known_rules(cls, values: list) -> list:
        if not values:
            raise ValueError("needs at least one preferred batch size choice")
        for v in values:
            if isinstance(v, str) and v not in PREFERRED_RULES:
                raise ValueError(
                    f"unknown preferred batch size rule {v!r}; known: {', '.join(PREFERRED_RULES)} or a list of sizes"
                )
        return values

    @model_validator(mode="after")
    def _check(self) -> SearchSpace:
        batches = self.max_batch_sizes == [0] or min(self.max_batch_sizes) >= 1  # [0]: no batch axis (fitted_to)
        if min(self.instances) < 1 or not batches or min(self.queue_delays_us) < 0:
            raise ValueError("instances and max batch sizes must be >= 1, queue delays >= 0")
        if not self.formats or len(set(self.formats)) != len(self.formats):
            raise ValueError("formats must be a non-empty list without duplicates")
        return self

    def fitted_to(self, max_batch_size: int) -> SearchSpace:
        """The grid a model can take: one without a batch axis (max_batch_size 0) varies only what does not batch
        (instances, formats); max batch, preferred sizes and the batcher's delay are dropped."""
        if max_batch_size > 0:
            return self
        return self.model_copy(update={"max_batch_sizes": [0], "preferred": ["none"], "queue_delays_us": [0]})

    # the search's coordinate axes, in the order a grid index lists them
    AXES: ClassVar[tuple[str, ...]] = ("format", "instances", "max_batch_size", "preferred", "queue_delay_us")

    def axis_values(self) -> dict[str, list]:
        return {
            "format": self.formats,
            "instances": self.instances,
            "max_batch_size": self.max_batch_sizes,
            "preferred": self.preferred,
            "queue_delay_us": self.queue_delays_us,
        }

    def shape(self) -> tuple[int, ...]:
        values = self.axis_values()
        return tuple(len(values[a]) for a in self.AXES)

    def at(self, index: tuple[int, ...]) -> Candidate:
        """The candidate at a grid index (format, instances, max batch, preferred, delay)."""
        f, i, b, p, d = index
        batch = self.max_batch_sizes[b]
        return Candidate(
            instances=self.instances[i],
            max_batch_size=batch,
            preferred_batch_sizes=resolve_preferred(self.preferred[p], batch),
            queue_delay_us=self.queue_delays_us[d],
            format=self.formats[f],
        )

    def indices(self) -> Iterable[tuple[int, ...]]:
        return itertools.product(*(range(n) for n in self.shape()))

    def grid(self) -> list[Candidate]:
        """Every distinct candidate, in a stable order (format, instances, max batch, preferred, delay)."""
        seen: dict[str, Candidate] = {}
        for index in self.indices():
            c = self.at(index)
            seen.setdefault(c.key, c)
        return list(seen.values())

    def nearest(
        self,
        instances: int,
        max_batch_size: int,
        preferred_batch_sizes: Iterable[int] = (),
        queue_delay_us: int = 0,
        format: str | None = None,
    ) -> tuple[int, ...]:
        """The grid index nearest to a configuration (e.g. a guide's default), dimension by dimension: numbers by
        log distance, preferred sizes by the rule that resolves closest, the format by name (else the first)."""

        def closest(values: list[int], target: float) -> int:
            return min(range(len(values)), key=lambda i: (abs(math.log1p(values[i]) - math.log1p(target)), values[i]))

        b = closest(self.max_batch_sizes, max_batch_size)
        want = set(preferred_batch_sizes)
        batch = self.max_batch_sizes[b]
        p = min(
            range(len(self.preferred)),
            key=lambda i: len(set(resolve_preferred(self.preferred[i], batch)) ^ {s for s in want if s <= batch}),
        )
        f = self.formats.index(format) if format in self.formats else 0
        return (f, closest(self.instances, instances), b, p, closest(self.queue_delays_us, queue_delay_us))

    def middle(self) -> tuple[int, ...]:
        """The default start: the first format and preferred choice, the middle of each numeric dimension."""
        _, ni, nb, _, nd = self.shape()
        return (0, (ni - 1) // 2, nb // 2, 0, (nd - 1) // 2)


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

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.throughput is not None and self.p99_ms is not None


TIE_K = 2.0  # candidates within 2 x their combined window noise of the best are a tie: the cheaper one wins


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

    def feasible(self, o: Observation) -> bool:
        if not o.ok:
            return False
        if self.goal == "max_throughput":
            return self.p99_budget_ms is None or o.p99_ms <= self.p99_budget_ms
        return self.throughput_floor is None or o.throughput >= self.throughput_floor

    def value(self, o: Observation) -> float:
        """Higher is better: throughput, or minus p99."""
        return o.throughput if self.goal == "max_throughput" else -o.p99_ms

    def violation(self, o: Observation) -> float:
        """How far outside the constraint, relative (0 when feasible; inf when nothing was measured)."""
        if not o.ok:
            return math.inf
        if self.goal == "max_throughput":
            return 0.0 if self.p99_budget_ms is None else max(0.0, o.p99_ms / self.p99_budget_ms - 1)
        return 0.0 if not self.throughput_floor else max(0.0, 1 - o.throughput / self.throughput_floor)

    def within_noise(self, best: Observation, other: Observation, k: float = TIE_K) -> bool:
        """Whether `other`'s objective is within `k` times the two measurements' combined noise of `best`'s: a
        difference the windows cannot tell from noise. Unknown noise ties nothing."""
        attr = "throughput_cv" if self.goal == "max_throughput" else "latency_cv"
        noise = [getattr(o, attr) for o in (best, other)]
        if any(n is None or math.isnan(n) for n in noise):
            return False
        return abs(self.value(best) - self.value(other)) <= k * math.hypot(*noise) * abs(self.value(best))

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


class Evaluator(Protocol):
    def evaluate(self, candidate: Candidate) -> Observation: ...


class Checkpoint:
    """A JSON-lines file, one Observation per measured candidate, appended and fsync'ed after every measurement.
    `load()` reads it back; a last line cut short (the process was killed mid-write) is dropped from the file, a
    corrupt line elsewhere is an error (that is not what a kill leaves)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> list[Observation]:
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")  # the last item is what follows the final newline (empty when the file ends with one)
        observations: list[Observation] = []
        offset = good_end = 0  # good_end: the byte just past the last line that parsed
        for i, line in enumerate(lines):
            end = offset + len(line) + (1 if i < len(lines) - 1 else 0)
            if line.strip():
                try:
                    observations.append(Observation.model_validate_json(line))
                except ValueError:
                    if any(rest.strip() for rest in lines[i + 1 :]):
                        raise ValueError(
                            f"{self.path}: line {i + 1} is not an observation and is not the last line; "
                            "the checkpoint is corrupt"
                        ) from None
                    break  # a torn last line: keep what came before it
            good_end = offset = end
        if good_end < len(raw) or (good_end and not raw[:good_end].endswith(b"\n")):
            self._repair(raw[:good_end])
        return observations

    def _repair(self, good: bytes) -> None:
        """Drop a torn tail so the next append starts on a line of its own."""
        if good and not good.endswith(b"\n"):
            good += b"\n"
        with open(self.path, "r+b") as f:
            f.seek(0)
            f.write(good)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())

    def append(self, observation: Observation) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(observation.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())


class SearchResult(BaseModel):
    strategy: str
    objective: Objective
    grid_size: int
    budget: int = Field(description="The most candidates the strategy may measure.")
    observations: list[Observation] = Field(description="Every candidate the search looked at, in order.")
    new_measurements: int = Field(0, description="Measured by this run; the rest came from the checkpoint.")
    seconds: float = 0.0

    @property
    def measured(self) -> int:
        return len(self.observations)

    @property
    def measured_fraction(self) -> float:
        return self.measured / self.grid_size if self.grid_size else 0.0

    def feasible(self) -> list[Observation]:
        """Feasible observations, best first."""
        return sorted(
            (o for o in self.observations if self.objective.feasible(o)), key=self.objective.rank, reverse=True
        )

    @property
    def best(self) -> Observation | None:
        """The best feasible observation; among those within noise of it, the cheapest configuration (fewest
        instances, then the smallest max batch, fewest preferred sizes and shortest queue delay)."""
        feasible = self.feasible()
        if not feasible:
            return None
        tied = [o for o in feasible if o is feasible[0] or self.objective.within_noise(feasible[0], o)]
        return min(tied, key=lambda o: (o.candidate.cost, -self.objective.value(o)))

    def closest(self) -> Observation | None:
        """The best-ranked observation, feasible or not (the least violation when none is feasible)."""
        return max(self.observations, key=self.objective.rank, default=None)

    def to_markdown(self, title: str = "Configuration search", plot: str | None = None) -> str:
        best = self.best
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
                f"**Best configuration**: {best.candidate.describe()}: **{best.throughput:.1f} infer/s**, "
                f"p99 {best.p99_ms:.2f} ms.",
                "",
            ]
        else:
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
        infeasible = sum(1 for o in self.observations if o.ok and not self.objective.feasible(o))
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
        for feasible, style in (
            (True, dict(color="#76b900", label="feasible")),
            (False, dict(color="#999999", label="infeasible")),
        ):
            pts = [o for o in ok if self.objective.feasible(o) == feasible]
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


def _table(observations: list[Observation]) -> str:
    header = "| # | format | instances | max batch | preferred | queue delay (us) | throughput (infer/s) | p99 (ms) |"
    rows = [header, "|---|---|---:|---:|---|---:|---:|---:|"]
    for i, o in enumerate(observations, 1):
        c = o.candidate
        pref = ",".join(map(str, c.preferred_batch_sizes)) or "none"
        rows.append(
            f"| {i} | {c.format or '-'} | {c.instances} | {c.max_batch_size} | {pref} | {c.queue_delay_us} | "
            f"{o.throughput:.1f} | {o.p99_ms:.2f} |"
        )
    return "\n".join(rows)


class BudgetSpent(Exception):
    """The strategy asked for one measurement more than its budget allows."""


class _Session:
    """Measures candidates for a strategy: from the checkpoint when it holds them, else through the evaluator
    (and appended to the checkpoint at once); counts what the strategy looked at against its budget."""

    def __init__(
        self, evaluator: Evaluator, checkpoint: Checkpoint | None, limit: int, on_observation: OnObservation | None
    ):
        self.evaluator, self.checkpoint, self.limit, self.on_observation = evaluator, checkpoint, limit, on_observation
        self.stored = {o.candidate.key: o for o in reversed(checkpoint.load())} if checkpoint else {}
        self.seen: dict[str, Observation] = {}
        self.new = 0

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
        self.seen[c.key] = obs
        if self.on_observation is not None:
            self.on_observation(obs, len(self.seen), self.limit)
        return obs

    def result(self, strategy: str, objective: Objective, grid_size: int, started: float) -> SearchResult:
        return SearchResult(
            strategy=strategy,
            objective=objective,
            grid_size=grid_size,
            budget=self.limit,
            observations=list(self.seen.values()),
            new_measurements=self.new,
            seconds=time.monotonic() - started,
        )


def exhaustive_search(
    space: SearchSpace,
    objective: Objective,
    evaluator: Evaluator,
    checkpoint: Checkpoint | None = None,
    on_observation: OnObservation | None = None,
) -> SearchResult:
    """Measure every candidate of the grid in grid order (those already in the checkpoint are read back)."""
    started = time.monotonic()
    grid = space.grid()
    session = _Session(evaluator, checkpoint, len(grid), on_observation)
    for c in grid:
        session.measure(c)
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
) -> SearchResult:
    """Coordinate search from the guide's default (`start`, else the middle of the grid): max batch, instances, queue
    delay, preferred sizes and format are line-searched in turn, with steps that start at half the dimension's range
    and halve down to one grid step, moving whenever a point ranks better (feasible first, then throughput or
    latency) and pruning, unmeasured, what lies beyond a step up in batch or delay that pushed p99 over the budget (or
    a step down that dropped throughput under the floor).
    Passes repeat until none moves; then the rest of the budget refines around the best point (its unmeasured
    neighbours one step away in one or two dimensions, the passes restarting from any that improves), and no more than
    `budget_fraction` of the grid (or `max_measurements`) is ever measured.

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
    return session.result("smart", objective, len(grid), started)


def _exhaustive(
    space: SearchSpace,
    objective: Objective,
    evaluator: Evaluator,
    checkpoint: Checkpoint | None = None,
    budget_fraction: float = 1.0,
    start: tuple[int, ...] | Candidate | None = None,
    on_observation: OnObservation | None = None,
) -> SearchResult:
    """exhaustive_search called as smart_search is: it has no budget and no start point, so it ignores them."""
    return exhaustive_search(space, objective, evaluator, checkpoint, on_observation=on_observation)


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
