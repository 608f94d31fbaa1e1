"""Lost points: a point that its sweep's runs served (status ok) and that the sweep's newest run did not serve.

A series holds the points their runs served, so a night whose point fell behind its rate, went unstable, errored or
was not measured at all is simply absent from it: the change detector cannot see it. This is the history's other
finding, as `tbench compare` has it (a point ok in the baseline and not in the candidate is lost): a point is lost in
the first run of its sweep (model, size, GPU, format, precision and scenario) that did not serve it after one that
did, with that run's status, or "absent" where the run measured the sweep but not the point. A lost point that now
fails its rule (behind, error: it no longer serves what it served) is a regression; one whose status cannot say
(unstable, undetermined, client-bound, absent) leaves the verdict undetermined. Like a change, it is news once, on the
run that lost it; the runs after it, while it stays lost, show it without telling it again.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from tbench.history.series import SERIES_KEYS, keyed_points, point_name, served

SWEEP_KEYS = ["model", "model_size", "gpu", "format", "precision", "scenario"]  # what one run measures together
ABSENT = "absent"  # the run measured the point's sweep but not the point
FAILED = ("behind", "error")  # statuses (tbench.core.metrics.POINT_STATUSES) in which a point no longer serves its load


@dataclass(frozen=True)
class LostPoint:
    key: dict  # SERIES_KEYS -> value
    status: str  # the point's status in its sweep's newest run (POINT_STATUSES but ok, or ABSENT)
    error: str  # that run's error text for it ("" where none)
    last_ok_run: str  # the last run of its sweep that served it
    lost_run: str  # the run after it: the first that did not
    newest_run: str  # its sweep's newest run

    @property
    def new(self) -> bool:
        """Lost by its sweep's newest run: what to tell, once."""
        return self.lost_run == self.newest_run

    @property
    def fails(self) -> bool:
        """It now fails its rule (a regression); otherwise the newest run cannot say (undetermined)."""
        return self.status in FAILED

    @property
    def name(self) -> str:
        return point_name(self.key)

    def line(self) -> str:
        error = f": {self.error}" if self.error else ""
        since = "" if self.new else f", still {self.status} in run {self.newest_run}"
        return f"{self.name}: lost, {self.status} in run {self.lost_run}{error} (ok in run {self.last_ok_run}){since}"


def newest_runs(points: pd.DataFrame) -> dict[tuple, str]:
    """Each sweep's (SWEEP_KEYS values) newest run, whatever its points' statuses."""
    if points.empty:
        return {}
    newest = keyed_points(points).sort_values("started_at", kind="stable").groupby(SWEEP_KEYS, dropna=False).last()
    return {tuple(k): r for k, r in newest["run_id"].items()}


def sweep_of(key: dict) -> tuple:
    return tuple(key[k] for k in SWEEP_KEYS)


def lost_points(points: pd.DataFrame) -> list[LostPoint]:
    """Every point (load_points: all statuses) that its sweep's runs served and its sweep's newest run did not, with
    where it was lost (the run after the last that served it) and its status now."""
    if points.empty:
        return []
    keyed = keyed_points(points).assign(served=served(points).to_numpy())
    found = []
    for _, sweep in keyed.groupby(SWEEP_KEYS, dropna=False, sort=True):
        runs = list(sweep.sort_values("started_at", kind="stable")["run_id"].drop_duplicates())
        position = {run_id: i for i, run_id in enumerate(runs)}
        for key_values, rows in sweep.groupby(SERIES_KEYS, dropna=False, sort=True):
            ok = [position[r] for r in rows.loc[rows["served"], "run_id"]]
            if not ok or max(ok) == len(runs) - 1:  # never served, or served by the newest run
                continue
            now = rows[rows["run_id"] == runs[-1]]  # several rows: the last one counts, as in tbench compare
            status = ABSENT if now.empty else now["status"].iloc[-1]
            status = str(status) if pd.notna(status) else FAILED[-1]  # measured, no status, no figure: an error
            error = now["error"].iloc[-1] if not now.empty else None
            found.append(
                LostPoint(
                    key=dict(zip(SERIES_KEYS, key_values)),
                    status=status,
                    error=str(error).strip() if isinstance(error, str) else "",
                    last_ok_run=runs[max(ok)],
                    lost_run=runs[max(ok) + 1],
                    newest_run=runs[-1],
                )
            )
    return found
