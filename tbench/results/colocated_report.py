"""The report of a co-located run (colocated.md): each model's throughput and percentile latency alone and together
on one server (the interference), the server's own queue and compute time per request for each, each rate point's
SLO verdict, and a plot of the percentile alone against together."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from tbench.core.metrics import THROUGHPUT
from tbench.request.colocated import ColocatedRequest

ALONE, TOGETHER = "alone", "together"  # tbench.stages.colocated's `colocation` values


def _number(value, spec: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(float(value), spec)


def _row(results: pd.DataFrame, model: str, colocation: str) -> dict | None:
    if results.empty or "colocation" not in results:
        return None
    rows = results[(results["model"] == model) & (results["colocation"] == colocation)]
    return None if rows.empty else rows.iloc[-1].to_dict()


def _change(alone: dict | None, together: dict | None, column: str) -> str:
    if not alone or not together:
        return "–"
    a, t = alone.get(column), together.get(column)
    if a is None or t is None or pd.isna(a) or pd.isna(t) or not a:
        return "–"
    return f"{100 * (float(t) - float(a)) / float(a):+.0f}%"


def _status(row: dict | None, pct: str) -> str:
    """The point's status, and its SLO verdict with the percentile it was judged on (an upper confidence bound where
    the requests were exported)."""
    if not row:
        return "not measured"
    status = str(row.get("status", ""))
    slo = row.get("slo")
    if not slo or pd.isna(slo):
        return status
    bound = row.get("slo_latency_ms")
    judged = f" ({pct} ≤ {_number(bound)} ms)" if bound is not None and not pd.isna(bound) else ""
    return f"{status}, SLO {slo}{judged}"


def render_colocated(
    results: pd.DataFrame, req: ColocatedRequest, *, status: str, error: str = "", plot: Path | None = None
) -> str:
    pct = f"p{req.percentile}"
    column = f"{pct}_ms"
    where = req.server_url or ", ".join(req.repositories)
    lines = [
        f"# {len(req.loads)} models on one server, alone and together",
        "",
        f"Server: {req.server} ({where}). Run status: **{status}**" + (f": {error}" if error else "") + ".",
        "",
        "Together, every model's perf_analyzer started at once, and each kept offering its load until every model's "
        "measurement had ended: each measured window had every other model's load on the server.",
        "",
        f"| model | load | alone: infer/s | alone: {pct} ms | together: infer/s | together: {pct} ms | {pct} change "
        "| status alone | status together |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for load in req.loads:
        alone, together = _row(results, load.name, ALONE), _row(results, load.name, TOGETHER)
        lines.append(
            f"| {load.name} | {load.label.removeprefix(load.name + ' at ')}"
            + (f", SLO {load.slo_ms:g} ms" if load.slo_ms else "")
            + f" | {_number((alone or {}).get(THROUGHPUT.column), '.4g')} | {_number((alone or {}).get(column))} "
            f"| {_number((together or {}).get(THROUGHPUT.column), '.4g')} | {_number((together or {}).get(column))} "
            f"| {_change(alone, together, column)} | {_status(alone, pct)} | {_status(together, pct)} |"
        )
    lines += [
        "",
        "## The server's time per request (Triton's statistics, per model)",
        "",
        "| model | queue ms alone | queue ms together | compute ms alone | compute ms together |",
        "|---|---:|---:|---:|---:|",
    ]
    for load in req.loads:
        alone, together = _row(results, load.name, ALONE) or {}, _row(results, load.name, TOGETHER) or {}
        lines.append(
            f"| {load.name} | {_number(alone.get('triton_queue_ms'))} | {_number(together.get('triton_queue_ms'))} "
            f"| {_number(alone.get('triton_compute_infer_ms'))} | {_number(together.get('triton_compute_infer_ms'))} |"
        )
    reasons = [
        f"- {r['model']} ({r['colocation']}): {r.get('slo_reason') or r.get('error')}"
        for r in (results.to_dict("records") if not results.empty else [])
        if (r.get("slo") not in ("", "pass", None) and not pd.isna(r.get("slo"))) or r.get("status") not in ("ok", None)
    ]
    if reasons:
        lines += ["", "## Points that did not hold", "", *reasons]
    if plot is not None:
        lines += ["", f"![{pct} alone and together](plots/{plot.name})"]
    return "\n".join(lines) + "\n"


def plot_colocated(results: pd.DataFrame, req: ColocatedRequest, plots_dir: Path) -> Path | None:
    """The percentile of each model alone and together, side by side, with each model's SLO where it has one."""
    column = f"p{req.percentile}_ms"
    if results.empty or "colocation" not in results or column not in results:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [load.name for load in req.loads]
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(names), 4))
    for offset, colocation, color in ((-0.2, ALONE, "#76b900"), (0.2, TOGETHER, "#1f77b4")):
        values = [(_row(results, n, colocation) or {}).get(column) for n in names]
        heights = [float(v) if v is not None and not pd.isna(v) else 0.0 for v in values]
        ax.bar([i + offset for i in range(len(names))], heights, width=0.4, color=color, label=colocation)
    for i, load in enumerate(req.loads):
        if load.slo_ms:
            label = "SLO" if i == next(j for j, x in enumerate(req.loads) if x.slo_ms) else None
            ax.hlines(load.slo_ms, i - 0.45, i + 0.45, colors="#d62728", linestyles="--", lw=1, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(f"p{req.percentile} latency (ms)")
    ax.set_title("Alone and together on one server", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    plots_dir.mkdir(parents=True, exist_ok=True)
    path = plots_dir / "colocated_latency.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
