"""A history judged: every series of an artifact root (tbench.history.series) run through the change detector
(tbench.history.detect), each change attributed from the manifests of its neighbouring segments
(tbench.history.attribute), and a verdict a scheduled run or a CI job can gate on: a regression that a series' newest
run confirmed, or a point that a sweep's newest run lost (tbench.history.lost: it served the point before and no
longer does). Each change and each lost point is news once, on the run that confirms or loses it; the runs after it see
it as history."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tbench.history.attribute import Difference, differences
from tbench.history.detect import MIN_SIZE, Change, judge
from tbench.history.lost import LostPoint, lost_points, newest_runs, sweep_of
from tbench.history.series import Series, build_series, load_points

MIN_RUNS = 2 * MIN_SIZE  # a series shorter than this cannot hold a confirmed change: it cannot be judged yet
NO_HISTORY, NO_REGRESSION, REGRESSION, UNDETERMINED = "no history", "no regression", "regression", "undetermined"
# undetermined: no series has MIN_RUNS runs yet, or the newest run lost a point with a status that cannot say why
# (unstable, undetermined, absent); like compare's "not comparable", a gate must not read it as a pass
EXIT_CODES = {NO_REGRESSION: 0, REGRESSION: 1, NO_HISTORY: 0, UNDETERMINED: 2}


@dataclass
class Finding:
    series: Series
    change: Change
    regression: bool  # the metric moved the bad way (throughput down, latency up)
    differences: list[Difference]
    new: bool = False  # the series' newest run confirmed it (no run before did): what to alert on, once
    candidate: bool = False  # the newest run alone: not yet confirmed by runs after it

    @property
    def run_before(self) -> str:
        return self.series.runs["run_id"].iloc[self.change.index - 1]

    @property
    def run_after(self) -> str:
        return self.series.runs["run_id"].iloc[self.change.index]

    @property
    def newest_run(self) -> str:
        return self.series.runs["run_id"].iloc[-1]

    def line(self) -> str:
        kind = "regression" if self.regression else "improvement"
        what = f"{self.series.name}: {kind} {self.change.relative:+.1%}"
        levels = f"{self.change.before:.4g} → {self.change.after:.4g} {self.series.metric.unit}"
        where = f"from run {self.run_after} on ({levels})"
        cause = "; ".join(d.line() for d in self.differences[:3]) or "nothing differed in the manifests"
        return f"{what} {where}{' (newest run only, not yet confirmed)' if self.candidate else ''}; {cause}"


@dataclass
class History:
    root: str
    series: list[Series]
    findings: list[Finding] = field(default_factory=list)
    runs: int = 0
    lost: list[LostPoint] = field(default_factory=list)  # points a sweep served and its newest run did not

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.regression]

    @property
    def alerts(self) -> list[Finding | LostPoint]:
        """What the verdict gates on: the confirmed regressions that their series' newest run confirmed, and the
        points their sweep's newest run lost."""
        regressions = [f for f in self.findings if f.regression and f.new and not f.candidate]
        return [*regressions, *(p for p in self.lost if p.new)]

    def news(self, run_id: str) -> list[Finding | LostPoint]:
        """The confirmed regressions `run_id` confirmed and the points it lost, each told once: on a later run it is
        no longer news, and a series that `run_id` did not measure has nothing new to say."""
        return [a for a in self.alerts if a.newest_run == run_id]

    def regressed(self, run_id: str) -> list[Finding | LostPoint]:
        """What of `run_id`'s news is a regression: its confirmed regressions and the points it lost that now fail
        their rule. A point lost to a status that cannot say why (unstable on a busy night) is news for the site and
        the run's log, not a regression to post: it would tell the team of a regression the verdict does not see."""
        return [a for a in self.news(run_id) if isinstance(a, Finding) or a.fails]

    @property
    def too_short(self) -> list[Series]:
        """The series with fewer than MIN_RUNS runs: no change in them can be confirmed yet."""
        return [s for s in self.series if s.runs["value"].notna().sum() < MIN_RUNS]

    @property
    def verdict(self) -> str:
        """A regression that a series' newest run confirmed, or a point the newest run lost that now fails its rule;
        undetermined where the newest run lost a point it cannot say why, or no series is long enough to judge. A
        candidate (the newest run alone, which cannot tell a step from an odd night) is shown, not gated on."""
        if not self.series:
            return NO_HISTORY
        alerts = self.alerts
        if any(isinstance(a, Finding) or a.fails for a in alerts):
            return REGRESSION
        if alerts or len(self.too_short) == len(self.series):
            return UNDETERMINED
        return NO_REGRESSION

    def summary(self) -> str:
        """The verdict in one line, with why where the runs cannot decide, and each point the newest runs lost."""
        line = f"{self.verdict}: {len(self.series)} series over {self.runs} runs"
        short = len(self.too_short)
        if self.series and short == len(self.series):
            line += f" (not enough runs: every series has fewer than {MIN_RUNS}, the fewest to confirm a change)"
        elif short:
            line += f" ({short} not judged yet: fewer than {MIN_RUNS} runs)"
        return "; ".join([line, *(p.line() for p in self.lost if p.new)])


def _is_regression(series: Series, change: Change) -> bool:
    return (change.relative < 0) if series.metric.higher_is_better else (change.relative > 0)


def judge_series(series: Series, manifests: dict[str, dict], min_effect: float = 0.05) -> list[Finding]:
    """One series judged as of its newest run (tbench.history.detect.judge): its changes (set on the series), which of
    them its newest run confirmed, a candidate, and what differed at each. The decision `tbench history`, the nightly
    history stage and benchmarks/calibration_history.py all take."""
    values, noise = series.runs["value"].to_numpy(float), series.runs["noise"].to_numpy(float)
    judged = judge(values, noise, min_effect=min_effect)
    series.changes = judged.changes
    run_ids = list(series.runs["run_id"])
    ends = [0, *(c.index for c in judged.changes), len(run_ids)]
    found = [(c, ends[i], ends[i + 2], c in judged.new, False) for i, c in enumerate(judged.changes)]
    if judged.candidate is not None:
        found.append((judged.candidate, ends[-2], len(run_ids), False, True))
    findings = []
    for change, start, end, new, candidate in found:
        # the neighbouring segments only: a later change of the same field (or its revert) cannot erase this one
        before = [manifests.get(r, {}) for r in run_ids[start : change.index]]
        after = [manifests.get(r, {}) for r in run_ids[change.index : end]]
        cause = differences(before, after, first_run=start)
        findings.append(Finding(series, change, _is_regression(series, change), cause, new=new, candidate=candidate))
    return findings


def analyse(root: str, model: str | None = None, gpu: str | None = None, min_effect: float = 0.05) -> History:
    """Every series under `root` (optionally one model's, one GPU's), its changes and what differed at each, and the
    points the newest runs lost."""
    points, manifests = load_points(root, model=model, gpu=gpu)
    return judge_points(points, manifests, root=root, min_effect=min_effect)


def judge_points(points: pd.DataFrame, manifests: dict[str, dict], root: str = "", min_effect: float = 0.05) -> History:
    """The history of `points` (load_points: every status) judged: each series (judge_series) and the lost points.
    A change confirmed by a series' newest run is new only where that run is its sweep's newest: a run that then
    lost the point has its own news (the point lost), and the change was told on the run that confirmed it."""
    history = History(root=root, series=build_series(points), runs=len(manifests), lost=lost_points(points))
    newest = newest_runs(points)
    for series in history.series:
        findings = judge_series(series, manifests, min_effect=min_effect)
        if newest.get(sweep_of(series.key)) != series.runs["run_id"].iloc[-1]:
            for finding in findings:
                finding.new = False
        history.findings += findings
    return history
