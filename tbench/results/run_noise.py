"""The run-to-run spread a comparison judges by: how much one point's figure moves from one server process to the next.

A run's windows agree with each other far better than two runs do (on these 2-core VMs the windows' CV was 3.5-6.7%
while fresh runs of one commit moved 4.5-20% per point): a rule that takes the windows' spread for the noise calls
every second A/A comparison a regression. The spread between runs is measured where it can be:
- **trials** (`tbench run --trials N`): each point measured in N server processes; a run's spread is the pooled
  variance of the log of its points' trials (each point's trials against their own mean), the two runs' pooled again;
- **paired** (`tbench run --against`: an A/B session, baseline and candidate runs measured round by round): the
  spread of each round's ratio, candidate over baseline, tested with one degree of freedom per round (a paired t-test);
  a slow stretch of the machine that moves a whole run (up to 22% here) moves both runs of its round and cancels;
- **stated**: a floor given for the machine (`tbench compare --run-cv`, and `--run-cv-p99` for the tail, which moves
  far more), e.g. from its history or a record;
- otherwise it is **unknown**, and no change can be put on the model (the windows say nothing of it).

A process's slowness multiplies its figures, so spreads and changes are taken on the log scale: a trial's spread is the
standard deviation of the log of its figure (about its CV for small spreads), and a point's change, the log of the
ratio of its means, is tested against `t(1 - ALPHA, df) * cv * sqrt(1/n_baseline + 1/n_candidate)` (Welch's test with
the pooled spread), the same distance up as down (on a linear scale a slow baseline trial made every candidate look
far higher in latency: 1.04% A/A regressions at a 20% spread in the calibration). `df` is the two runs' trials less
two, as if every point of a trial moved together (a slow process is slow at every point, so pooling points adds no
independent evidence), infinite for a stated spread. Where that threshold exceeds the smallest effect asked for
(`log1p(min_effect)`), the data cannot resolve it: a change inside the threshold is "undetermined", and
`trials_needed` says how many trials would resolve it.

Plain functions over the results table; no Prefect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.special import stdtrit

from tbench.request.benchmark import MAX_TRIALS  # the request's bound on --trials

TRIAL = "trial"  # the results column (tbench.core.metrics)
ALPHA = 0.0025  # one-sided, per point and metric: 0.005 gave 1.7% A/A regressions at a 20% spread (calibration)


@dataclass(frozen=True)
class RunSpread:
    """The spread of one trial per metric, of the log of its figure (NaN: unknown), whether the runs' trials measured
    it (else it was stated) and where it came from."""

    cv: dict[str, float] = field(default_factory=dict)
    measured: bool = False
    source: str = "unknown"
    paired: bool = False  # from an A/B session's rounds: each baseline trial measured beside its candidate trial

    def known(self, metric: str) -> bool:
        return not math.isnan(self.cv.get(metric, math.nan))

    def df(self, n_baseline: int, n_candidate: int) -> float:
        """The spread's degrees of freedom: a measured one's, as if each trial's points moved together (a slow server
        process is slow at every point, so its points add no independent evidence); a stated one is taken as known."""
        if self.paired:  # one difference per round
            return float(max(1, min(n_baseline, n_candidate) - 1))
        return float(max(1, n_baseline - 1 + n_candidate - 1)) if self.measured else math.inf

    def threshold(self, metric: str, n_baseline: int, n_candidate: int) -> float:
        """The smallest change of a point's mean, as the log of its ratio, that the spread lets one call (NaN when
        unknown)."""
        if not self.known(metric):
            return math.nan
        scale = math.sqrt(1.0 / n_baseline + 1.0 / n_candidate)
        return t_quantile(self.df(n_baseline, n_candidate)) * self.cv[metric] * scale

    def trials_needed(self, metric: str, min_effect: float) -> int | None:
        """Trials per run (both runs alike) that would resolve `min_effect` at this spread; None beyond MAX_TRIALS."""
        if not self.known(metric):
            return None
        for n in range(2, MAX_TRIALS + 1):
            if self.threshold(metric, n, n) <= math.log1p(min_effect):
                return n
        return None

    def describe(self, metric: str) -> str:
        if not self.known(metric):
            return "run-to-run spread unknown"
        if self.paired:  # the cv kept is the ratio's over sqrt(2): the figure a reader can check is the ratio's
            return f"spread of the rounds' ratios {100 * math.sqrt(2) * self.cv[metric]:.1f}% ({self.source})"
        return f"run-to-run spread {100 * self.cv[metric]:.1f}% ({self.source})"


def t_quantile(df: float) -> float:
    """Student's t at 1 - ALPHA; a stated floor (infinite df) gives the normal quantile."""
    return float(stdtrit(min(df, 1e9), 1.0 - ALPHA))


def trial_rows(results: pd.DataFrame, idx: list[int]) -> pd.DataFrame:
    """A point's ok rows, the last of each trial (a point measured twice within a trial counts once)."""
    rows = results.loc[idx]
    rows = rows[rows["status"] == "ok"]
    if TRIAL not in rows or rows[TRIAL].isna().all():
        return rows.tail(1)
    return rows.groupby(rows[TRIAL].fillna(1), sort=True).tail(1)


def pooled_spread(groups: list[pd.DataFrame], metrics: list[str]) -> tuple[dict[str, float], float]:
    """The pooled variance of the log of the points' trials (each against its own mean): {metric: spread}, degrees of
    freedom. Points with one trial add nothing."""
    cvs, df = {}, 0.0
    for metric in metrics:
        squares, dof = 0.0, 0
        for rows in groups:
            values = rows[metric].dropna().to_numpy(dtype=float)
            if len(values) < 2 or (values <= 0).any():
                continue
            logs = np.log(values)
            squares += float(np.sum((logs - logs.mean()) ** 2))
            dof += len(values) - 1
        cvs[metric] = math.sqrt(squares / dof) if dof else math.nan
        df = max(df, dof)
    return cvs, df


def paired_spread(pairs: list[tuple[pd.DataFrame, pd.DataFrame]], metrics: list[str]) -> RunSpread:
    """The spread of an A/B session's matched points (`pairs`: each point's baseline and candidate trial rows, one
    per round): the pooled variance of the log of each round's ratio (each point's against its own mean), halved so
    that Welch's scale sqrt(1/n + 1/n) gives the paired test's sd/sqrt(n). What moved a whole round moved both sides
    and cancels."""
    cvs = {}
    rounds = 0
    for metric in metrics:
        squares, dof = 0.0, 0
        for b_rows, c_rows in pairs:
            both = b_rows[[TRIAL, metric]].merge(c_rows[[TRIAL, metric]], on=TRIAL, suffixes=("_b", "_c")).dropna()
            b, c = both[f"{metric}_b"].to_numpy(dtype=float), both[f"{metric}_c"].to_numpy(dtype=float)
            if len(b) < 2 or (b <= 0).any() or (c <= 0).any():
                continue
            d = np.log(c) - np.log(b)
            squares += float(np.sum((d - d.mean()) ** 2))
            dof += len(d) - 1
            rounds = max(rounds, len(d))
        cvs[metric] = math.sqrt(squares / dof / 2) if dof else math.nan
    return RunSpread(cvs, True, f"paired over {rounds} rounds of one A/B session", paired=True)


def run_spread(
    groups: list[pd.DataFrame], metrics: list[str], stated: dict[str, float | None] | None = None
) -> RunSpread:
    """The spread of the two runs' matched points (`groups`: each point's trial rows, baseline's and candidate's
    apart): measured from trials where any point has two, else the floor stated per metric (a metric stated None
    stays unknown: a tail moves from run to run far more than a mean), else unknown."""
    cvs, df = pooled_spread(groups, metrics)
    if df > 0:
        trials = max(len(g) for g in groups)
        return RunSpread(cvs, True, f"measured over up to {trials} trials per point")
    given = {m: v for m, v in (stated or {}).items() if v is not None}
    if given:
        words = ", ".join(f"{m.split('_')[0]} {100 * v:g}%" for m, v in given.items())
        return RunSpread({m: float(given.get(m, math.nan)) for m in metrics}, False, f"stated: {words}")
    return RunSpread(dict.fromkeys(metrics, math.nan))
