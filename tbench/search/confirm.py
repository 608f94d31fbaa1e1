"""Confirmation: when the windows cannot separate the leader from its contenders, or a configuration that would beat
the choice meets the limit on its estimate but not by its noise, measure those candidates again and select again.

A re-measurement is the evaluator's own call (a real search writes, loads, measures and unloads the configuration
again) and is kept as one more checkpoint line, tagged with its round (`Observation.confirm_round`), so that a resumed
search reads it back instead of measuring it again. A candidate's measurements are combined (`combine`) into one
observation over all their windows: the mean over every window, and the window CV over every window (within and
between measurements), so its standard error narrows as 1/sqrt(windows). At most CONFIRM_ROUNDS rounds (a smart search:
SMART_CONFIRM_ROUNDS) of at most CONFIRM_WIDTH candidates each: the leader and the answer first, then the others by
how good they may be (their value TIE_K standard errors up). A round re-measures only what may still change the answer
or its verdict, so the rounds stop early where the noise is low (benchmarks/calibration_search.py measures both)."""

from __future__ import annotations

import math
from typing import Protocol

from pydantic import BaseModel, Field

from tbench.search.objective import TIE_K, TIE_MARGIN, Objective, Observation, Selection, pooled_noise, select
from tbench.search.space import Candidate

CONFIRM_ROUNDS = 6  # re-measurement rounds at most (0: no confirmation)
SMART_CONFIRM_ROUNDS = 2  # a smart search's: it measures a small share of the grid, so a lighter confirmation
CONFIRM_WIDTH = 3  # candidates re-measured per round at most: the leader and its closest contenders


class ConfirmationRound(BaseModel):
    """One round: why it ran, what it re-measured, and how many windows each re-measured candidate then rests on."""

    round: int
    verdict_before: str = Field(
        "", description="The verdict that called for the round (best | tie | undetermined ...)."
    )
    reason: str = ""
    remeasured: list[str] = Field(default_factory=list, description="Candidate keys re-measured, leader first.")
    windows: dict[str, int] = Field(default_factory=dict, description="Key -> windows its figures combine after it.")
    failed: dict[str, str] = Field(default_factory=dict, description="Key -> status of a re-measurement that failed.")
    from_checkpoint: int = Field(0, description="Re-measurements read back from the checkpoint (a resumed search).")


def _window_cv(means: list[float] | None, cvs: list[float | None], n: list[int]) -> float | None:
    """The CV over all windows of several measurements, from each one's mean, CV and window count (the variance of
    the pooled windows: within each measurement and between them); without means, the within-measurement part."""
    if any(cv is None or math.isnan(cv) for cv in cvs):
        return None
    total = sum(n)
    if means is None:
        dof = sum(k - 1 for k in n)
        return math.sqrt(sum((k - 1) * cv**2 for k, cv in zip(n, cvs)) / dof) if dof > 0 else None
    mean = sum(k * m for k, m in zip(n, means)) / total
    within = sum((k - 1) * (cv * m) ** 2 for k, cv, m in zip(n, cvs, means))
    between = sum(k * (m - mean) ** 2 for k, m in zip(n, means))
    return math.sqrt((within + between) / (total - 1)) / abs(mean) if mean else None


def combine(measurements: list[Observation]) -> Observation:
    """One candidate's measurements (the first, then its re-measurements) as one observation: the figures are the
    means over all their windows (each measurement weighted by its windows), the CVs those of all the windows, and
    `windows`/`measurements` count what they rest on. A re-measurement that failed adds no numbers (the confirmation
    round records it); when none is ok, the last one stands for the candidate."""
    if len(measurements) == 1:
        return measurements[0]
    seconds = sum(m.seconds for m in measurements)
    last_round = max(m.confirm_round for m in measurements)
    ok = [m for m in measurements if m.ok]
    if len(ok) <= 1:
        base = ok[0] if ok else measurements[-1]
        return base.model_copy(update={"seconds": seconds, "confirm_round": last_round})
    n = [m.windows for m in ok]
    total = sum(n)

    def mean(attr: str) -> float | None:
        values = [getattr(m, attr) for m in ok]
        return None if any(v is None for v in values) else sum(k * v for k, v in zip(n, values)) / total

    avg = [m.avg_ms for m in ok]
    return ok[0].model_copy(
        update={
            "throughput": mean("throughput"),
            "p99_ms": mean("p99_ms"),
            "avg_ms": mean("avg_ms"),
            "throughput_cv": _window_cv([m.throughput for m in ok], [m.throughput_cv for m in ok], n),
            "latency_cv": _window_cv(None if any(a is None for a in avg) else avg, [m.latency_cv for m in ok], n),
            "windows": total,
            "measurements": len(ok),
            "seconds": seconds,
            "confirm_round": last_round,
        }
    )


def targets(
    objective: Objective, selection: Selection, observations: list[Observation], width: int
) -> list[Observation]:
    """What a round re-measures: when the verdict is undetermined, the measured leader, the answer and the contenders
    the windows cannot separate from it; and any configuration better than the answer that meets the limit on its
    estimate but not by its noise; only those whose noise is known. The leader and the answer first, then by how good
    they may be (their value TIE_K standard errors up), `width` at most."""
    if width <= 0:
        return []
    pooled = pooled_noise(observations)
    named = _better_near_limit(objective, selection)
    if selection.verdict == "undetermined":
        named += selection.contenders
    # without the windows' noise nothing can be narrowed: a re-measurement would not decide (nor be combined)
    named = [o for o in named if objective.value_error(o, pooled) is not None]
    if not named:
        return []

    def upper(o: Observation) -> float:  # how good it may be: its value TIE_K standard errors up
        return objective.value(o) + TIE_K * (objective.value_error(o, pooled) or 0.0) * abs(objective.value(o))

    out: list[Observation] = []
    for o in [selection.leader, selection.best, *sorted(named, key=upper, reverse=True)]:
        if o is not None and all(o.candidate.key != p.candidate.key for p in out):
            out.append(o)
    return out[:width]


class Session(Protocol):
    """What confirmation needs of a search: its observations now (each candidate's measurements combined), a
    re-measurement of a candidate in a round (from the checkpoint when it holds it), and how many came from there."""

    read_back: int

    def observations(self) -> list[Observation]: ...

    def remeasure(self, candidate: Candidate, confirm_round: int) -> Observation: ...


def confirm(
    objective: Objective, session: Session, rounds: int = CONFIRM_ROUNDS, width: int = CONFIRM_WIDTH
) -> list[ConfirmationRound]:
    """Up to `rounds` rounds: select on the combined observations, re-measure the targets, and select again; stops
    as soon as a selection names nothing to re-measure. Deterministic given the measurements, so a resumed search
    asks for the same re-measurements and reads them back."""
    done: list[ConfirmationRound] = []
    for r in range(1, rounds + 1):
        current = session.observations()
        selection = select(objective, current)
        chosen = targets(objective, selection, current, width)
        if not chosen:
            break
        before = session.read_back
        record = ConfirmationRound(round=r, verdict_before=selection.verdict, reason=_why(objective, selection))
        for o in chosen:
            new = session.remeasure(o.candidate, r)
            record.remeasured.append(o.candidate.key)
            if not new.ok:
                record.failed[o.candidate.key] = f"{new.status} {new.error}".strip()
        after = {o.candidate.key: o for o in session.observations()}
        record.windows = {key: after[key].windows for key in record.remeasured}
        record.from_checkpoint = session.read_back - before
        done.append(record)
    return done


def combined_lines(lines: list[Observation]) -> list[Observation]:
    """A checkpoint's lines as one observation per candidate, in the order of their first measurements: each one's
    first measurement combined with its re-measurements (the first line of each round counts)."""
    first: dict[str, Observation] = {}
    again: dict[tuple[str, int], Observation] = {}
    for o in lines:
        if o.confirm_round:
            again.setdefault((o.candidate.key, o.confirm_round), o)
        else:
            first.setdefault(o.candidate.key, o)
    rounds = sorted(again)
    return [combine([o, *(again[k] for k in rounds if k[0] == key)]) for key, o in first.items()]


def rounds_from_checkpoint(lines: list[Observation], combined: list[Observation]) -> list[ConfirmationRound]:
    """The confirmation rounds a checkpoint holds (an interrupted search's report): its re-measurements by round."""
    windows = {o.candidate.key: o.windows for o in combined}
    by_round: dict[int, ConfirmationRound] = {}
    for o in lines:
        if o.confirm_round:
            record = by_round.setdefault(o.confirm_round, ConfirmationRound(round=o.confirm_round))
            record.remeasured.append(o.candidate.key)
            record.windows[o.candidate.key] = windows.get(o.candidate.key, o.windows)
            record.from_checkpoint += 1
            if not o.ok:
                record.failed[o.candidate.key] = f"{o.status} {o.error}".strip()
    return [by_round[r] for r in sorted(by_round)]


def _better_near_limit(objective: Objective, selection: Selection) -> list[Observation]:
    """Configurations that meet the limit on their estimate, not by its noise, and would beat the answer if they do."""
    floor = objective.value(selection.best) if selection.best is not None else -math.inf
    return [o for o in selection.near_limit if objective.value(o) > floor]


def _why(objective: Objective, selection: Selection) -> str:
    parts = []
    if selection.verdict == "undetermined":
        parts.append(f"{len(selection.contenders)} configuration(s) may be more than {100 * TIE_MARGIN:g}% better")
    near = _better_near_limit(objective, selection)
    if near:
        parts.append(f"{len(near)} better configuration(s) within the noise of the limit")
    return "; ".join(parts)
