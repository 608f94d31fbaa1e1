"""A pipeline's report section (an ensemble, or a python model calling others): where its time goes at each
measured point from Triton's statistics (tbench.core.pipeline_steps), and the step that bounds its throughput at
each scenario's best point, named."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tbench.core.metrics import THROUGHPUT
from tbench.core.pipeline_steps import SATURATED_PCT, Bound, bounding_step
from tbench.results.report_plots import plot_steps_busy

POINT_KEYS = ["scenario", "batch_size", "concurrency", "request_rate"]
STEPS_TABLE = {
    "point": "Point",
    "step": "Step",
    "role": "Role",
    "instances": "Instances",
    "calls_per_request": "Calls per request",
    "batch": "Batch formed",
    "queue_ms": "Queue (ms)",
    "compute_ms": "Compute (ms)",
    "own_ms": "Own work (ms)",
    "busy_pct": "Busy (%)",
    "ceiling_per_s": "Full at (infer/s)",
}


def point_label(row) -> str:
    """A point in words: its scenario, batch, and its concurrency or rate."""
    label = f"{row['scenario']} b{int(row['batch_size'])}"
    if pd.notna(row.get("request_rate")):
        return f"{label} {float(row['request_rate']):g}/s"
    if pd.notna(row.get("concurrency")):
        return f"{label} c{float(row['concurrency']):g}"
    return label


def _labelled(table: pd.DataFrame) -> pd.DataFrame:
    return table.assign(point=[point_label(r) for _, r in table.iterrows()])


def bounds(steps: pd.DataFrame, results: pd.DataFrame) -> dict[str, tuple[str, float, Bound]]:
    """Per scenario: its best measured point (label, infer/s) and what bounded it."""
    if steps is None or steps.empty or results.empty:
        return {}
    if "format" in results and "format" in steps:  # a run of several formats: the pipeline's points only
        results = results[results["format"].isin(set(steps["format"]))]
    ok = _labelled(results[results["status"] == "ok"])
    steps = _labelled(steps)
    found: dict[str, tuple[str, float, Bound]] = {}
    for scenario, rows in ok.groupby("scenario", sort=True):
        best = rows.loc[rows[THROUGHPUT.column].idxmax()]
        at = steps[steps["point"] == best["point"]]
        if not at.empty:
            found[str(scenario)] = (best["point"], float(best[THROUGHPUT.column]), bounding_step(at))
    return found


def bounds_manifest(steps: pd.DataFrame, results: pd.DataFrame) -> dict:
    """The manifest's words of the same: per scenario, the best point and the step that bounded it (None: none)."""
    return {
        scenario: {"point": point, "infer_per_s": rate, "step": b.step, "busy_pct": b.busy_pct, "line": b.line()}
        for scenario, (point, rate, b) in bounds(steps, results).items()
    }


def pipeline_lines(steps: pd.DataFrame, results: pd.DataFrame, plots_dir: Path) -> list[str]:
    """The section; empty for a model that is not a pipeline (no step rows)."""
    if steps is None or steps.empty:
        return []
    lines = [
        "## Where the pipeline spends its time",
        "",
        "Per step and point, from Triton's statistics read at the point's start and end: each step's queue and compute "
        "time per request, the batch it formed, and the pipeline's rate at which its instances would be busy all the "
        "time (their count times the pipeline's inferences over the time they spent executing); at the point's "
        f"measured throughput it is busy that throughput over this rate. A step busy {SATURATED_PCT:.0f}% or more is "
        "full: it bounds the pipeline's throughput. A python model that calls others holds its instance while they "
        "run: its row counts that time, and its own work is its compute less its calls' server time (an estimate).",
        "",
    ]
    for scenario, (point, rate, bound) in bounds(steps, results).items():
        lines.append(f"- **{scenario}**, best point {point} ({rate:,.0f} infer/s): {bound.line()}.")
    labelled = _labelled(steps)
    points = list(dict.fromkeys(_labelled(results)["point"])) if not results.empty else []
    busy = labelled.dropna(subset=["busy_pct"])
    lines.append("")
    if not busy.empty:  # no point measured: nothing to draw
        picture = plot_steps_busy(busy, points or list(busy["point"]), plots_dir)
        lines += [f"![]({picture.relative_to(plots_dir.parent).as_posix()})", ""]
    columns = list(STEPS_TABLE)
    table = labelled.sort_values(["scenario", "batch_size", "concurrency", "request_rate", "step"])
    shown = table[columns].round(2).astype(object)
    shown = shown.where(shown.notna(), "-")  # a step has no own work, a step without executions no ceiling
    return lines + [shown.rename(columns=STEPS_TABLE).to_markdown(index=False), ""]
