"""A history judged: every series of an artifact root (tbench.history.series) run through the change detector
(tbench.history.detect), each change attributed from the manifests (tbench.history.attribute), and a verdict a
scheduled run or a CI job can gate on: a regression in the newest runs of any series."""

from __future__ import annotations

from dataclasses import dataclass, field

from tbench.history.attribute import Difference, differences
from tbench.history.detect import Change, detect_changes, judge_latest
from tbench.history.series import Series, build_series, load_points

RECENT_RUNS = 3  # a change that starts within a series' newest runs is news: the verdict is about these
EXIT_CODES = {"no regression": 0, "regression": 1, "no history": 0}


@dataclass
class Finding:
    series: Series
    change: Change
    regression: bool  # the metric moved the bad way (throughput down, latency up)
    differences: list[Difference]
    recent: bool  # it starts within the series' newest RECENT_RUNS runs
    candidate: bool = False  # the newest run alone: not yet confirmed by runs after it (judge_latest)

    @property
    def run_before(self) -> str:
        return self.series.runs["run_id"].iloc[self.change.index - 1]

    @property
    def run_after(self) -> str:
        return self.series.runs["run_id"].iloc[self.change.index]

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

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.regression]

    def news(self, run_id: str) -> list[Finding]:
        """The confirmed regressions `run_id` is part of, among a series' newest runs: what to tell people about."""
        return [
            f
            for f in self.findings
            if f.regression
            and f.recent
            and not f.candidate
            and run_id in set(f.series.runs["run_id"][f.change.index :])
        ]

    @property
    def verdict(self) -> str:
        """A confirmed regression in some series' newest runs; a candidate (the newest run alone, which cannot tell a
        step from an odd night) is shown, not gated on."""
        if not self.series:
            return "no history"
        news = [f for f in self.findings if f.regression and f.recent and not f.candidate]
        return "regression" if news else "no regression"


def _is_regression(series: Series, change: Change) -> bool:
    return (change.relative < 0) if series.metric.higher_is_better else (change.relative > 0)


def analyse(root: str, model: str | None = None, gpu: str | None = None, min_effect: float = 0.05) -> History:
    """Every series under `root` (optionally one model's, one GPU's), its changes and what differed at each."""
    points, manifests = load_points(root, model=model, gpu=gpu)
    history = History(root=root, series=build_series(points), runs=len(manifests))
    for series in history.series:
        values, noise = series.runs["value"].to_numpy(float), series.runs["noise"].to_numpy(float)
        series.changes = detect_changes(values, noise, min_effect=min_effect)
        found = [(c, False) for c in series.changes]
        latest = judge_latest(values, noise, min_effect=min_effect)
        if latest is not None and not latest.confirmed:  # a confirmed one is among the changes already
            found.append((latest, True))
        run_ids = list(series.runs["run_id"])
        for change, candidate in found:
            before = [manifests.get(r, {}) for r in run_ids[: change.index]]
            after = [manifests.get(r, {}) for r in run_ids[change.index :]]
            history.findings.append(
                Finding(
                    series=series,
                    change=change,
                    regression=_is_regression(series, change),
                    differences=differences(before, after),
                    recent=change.index >= len(run_ids) - RECENT_RUNS,
                    candidate=candidate,
                )
            )
    return history
