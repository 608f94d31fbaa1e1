"""One side of a comparison made of several runs: each run is a trial of that side.

`tbench compare A1,A2,A3 B1,B2,B3` judges three runs against three; `tbench run --against` measures its two model files
round by round in one A/B session (SessionRound in each run's request), and then each round's baseline and candidate
ran back to back: a drift of the machine that makes a whole run slower (on these VMs whole runs moved by up to 22%)
hits both alike, and the comparison pairs them (tbench.results.run_noise: the spread of the rounds' ratios).

Plain functions over RunResults; no Prefect.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import pandas as pd

from tbench.results.run_noise import TRIAL
from tbench.results.run_results import RunResults, load_run


def split_runs(side: str) -> list[str]:
    """A side as the command line gives it: one run folder, or several joined by commas (each a trial)."""
    return [s.strip() for s in side.split(",") if s.strip()]


def load_side(side: str | os.PathLike | RunResults | list) -> RunResults:
    """A side's runs as one RunResults: a run, or several (a comma-separated string or a list) as its trials."""
    if isinstance(side, RunResults):
        return side
    if isinstance(side, os.PathLike):
        side = [side]
    sources = split_runs(side) if isinstance(side, str) else [os.fspath(s) for s in side]
    runs = [load_run(s) for s in sources]
    return runs[0] if len(runs) == 1 else combine_runs(runs)


def combine_runs(runs: list[RunResults]) -> RunResults:
    """Several runs of one side as one: their rows with trials numbered across the runs (a run of 3 trials followed by
    one of 2: trials 1-5), its manifest the first run's with the busiest neighbour seen (a neighbour in any run keeps
    the verdict off the model) and every run's session round."""
    rounds = [session_of(r) for r in runs]
    by_round = None not in rounds and all(_trial_count(r) == 1 for r in runs)  # trial i: the session's round i
    tables, offset = [], 0
    for run, place in zip(runs, rounds):
        table = run.results.copy()
        trials = table[TRIAL].fillna(1).astype(int) if TRIAL in table else pd.Series(1, index=table.index)
        table[TRIAL] = place["round"] if by_round else trials + offset
        offset += int(trials.max()) if len(trials) else 1
        tables.append(table)
    manifest = dict(runs[0].manifest)
    busiest = max((r.neighbour_cpu_pct for r in runs if not math.isnan(r.neighbour_cpu_pct)), default=None)
    if busiest is not None:
        manifest["host"] = {**(manifest.get("host") or {}), "other_cpu_pct": {"mean": busiest}}
    manifest["sessions"] = rounds
    source = ",".join(r.source for r in runs)
    name = f"{runs[0].name} and {len(runs) - 1} more"
    return RunResults(source=source, name=name, results=pd.concat(tables, ignore_index=True), manifest=manifest)


def session_of(run: RunResults) -> dict | None:
    """The run's place in an A/B session (`tbench run --against`), as its request recorded it; None for a plain run."""
    return (run.manifest.get("request") or {}).get("session")


def _rounds(run: RunResults) -> list[dict | None]:
    return run.manifest.get("sessions") or [session_of(run)]


@dataclass(frozen=True)
class Pairing:
    """How the two sides' trials pair: the baseline's round i with the candidate's round i (each side's trials are
    its runs' rounds of one A/B session), over the rounds both sides measured."""

    session: str
    rounds: tuple[int, ...]

    @staticmethod
    def of(baseline: RunResults, candidate: RunResults) -> Pairing | None:
        b, c = _rounds(baseline), _rounds(candidate)
        if None in b or None in c or len({s["id"] for s in b + c}) != 1:
            return None
        if any(s["side"] != "baseline" for s in b) or any(s["side"] != "candidate" for s in c):
            return None
        if any(_trial_count(r) != len(places) for r, places in ((baseline, b), (candidate, c))):
            return None  # a run of several trials: its trials are not rounds
        common = tuple(sorted({s["round"] for s in b} & {s["round"] for s in c}))
        return Pairing(b[0]["id"], common) if len(common) >= 2 else None


def _trial_count(run: RunResults) -> int:
    return int(run.results[TRIAL].nunique()) if TRIAL in run.results else 1
