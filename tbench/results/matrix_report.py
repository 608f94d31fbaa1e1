"""The cross-GPU comparison report of a matrix of runs: per model, format and precision, the guides' tables with one
column group per GPU side by side (best offline throughput and its batch, best online throughput under each GPU's
grid and its p99), and throughput-vs-batch curves of every GPU on one plot. The tables hold the runs that completed;
the runs that did not finish are listed with their state and why (flows/matrix.py decides which are which)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

TPUT = "throughput_infer_per_s"
NOT_FINISHED_COLUMNS = {
    "pool": "Pool",
    "model": "Model",
    "format": "Format",
    "precision": "Precision",
    "state": "State",
    "reason": "Reason",
    "flow_run": "Flow run",
    "run_url": "Run folder",
}


def _best(rows: pd.DataFrame) -> pd.Series | None:
    ok = rows[(rows["status"] == "ok") & rows[TPUT].notna()]
    return ok.loc[ok[TPUT].idxmax()] if not ok.empty else None


def load_label(scenario: str, row: pd.Series) -> str:
    """Where a point sits in its scenario's grid: b8 (offline), c4 (online) or r50 (rate: the offered requests/s)."""
    if scenario == "offline":
        return f"b{row['batch_size']:g}"
    if scenario == "rate":
        return f"r{row['request_rate']:g}"
    return f"c{row['concurrency']:g}"


def side_by_side(results: pd.DataFrame) -> pd.DataFrame:
    """One row per model x format x precision x scenario, one column pair per GPU."""
    rows = []
    for (model, fmt, precision, scenario), group in results.groupby(
        ["model", "format", "precision", "scenario"], sort=True
    ):
        row = {"Model": model, "Format": fmt, "Precision": precision, "Scenario": scenario}
        for gpu, per_gpu in group.groupby("gpu", sort=True):
            best = _best(per_gpu)
            where = "" if best is None else load_label(scenario, best)
            row[f"{gpu}: best infer/s"] = "-" if best is None else f"{best[TPUT]:.1f} ({where})"
            row[f"{gpu}: p99 ms"] = "-" if best is None else f"{best['p99_ms']:.2f}"
        rows.append(row)
    return pd.DataFrame(rows)


def plot_gpus(results: pd.DataFrame, model: str, fmt: str, precision: str, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    offline = results[
        (results["model"] == model)
        & (results["format"] == fmt)
        & (results["precision"] == precision)
        & (results["scenario"] == "offline")
        & (results["status"] == "ok")
    ]
    if offline.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for gpu, rows in offline.groupby("gpu", sort=True):
        rows = rows.sort_values("batch_size")
        ax.plot(rows["batch_size"], rows[TPUT], marker="o", label=gpu)
    ax.set(
        xscale="log",
        xlabel="Batch size",
        ylabel="Inferences/second",
        title=f"{model} {fmt} {precision}: offline, per GPU",
    )
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cells(table: pd.DataFrame) -> pd.DataFrame:
    """Text cells a markdown table keeps whole: a `|` in a message would end its cell."""
    return table.fillna("").astype(str).apply(lambda col: col.str.replace("|", "\\|", regex=False))


def not_finished(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that did not complete, with the columns a reader needs to find out why."""
    missing = runs[runs["state"] != "COMPLETED"]
    return _cells(missing.reindex(columns=list(NOT_FINISHED_COLUMNS))).rename(columns=NOT_FINISHED_COLUMNS)


def matrix_markdown(results: pd.DataFrame, runs: pd.DataFrame, out_dir: Path) -> str:
    """The whole report; plots go to out_dir/plots. `results` holds the completed runs' points only."""
    missing = not_finished(runs)
    summary = f"{len(runs)} runs; {len(runs) - len(missing)} completed."
    if len(missing):
        summary += (
            f" {len(missing)} did not finish (see Runs that did not finish): the tables below compare the others."
        )
    lines = [
        "# Triton benchmark matrix: GPUs side by side",
        "",
        summary,
        "",
        "## Runs",
        "",
        _cells(runs.drop(columns=["reason"], errors="ignore")).to_markdown(index=False),
        "",
    ]
    if len(missing):
        lines += ["## Runs that did not finish", "", missing.to_markdown(index=False), ""]
    if results.empty:
        return "\n".join(lines + ["No run stored results.", ""])
    lines += ["## Best points per GPU", "", side_by_side(results).to_markdown(index=False), ""]
    for (model, fmt, precision), _ in results.groupby(["model", "format", "precision"], sort=True):
        plot = plot_gpus(
            results, model, fmt, precision, out_dir / "plots" / f"{model}_{fmt}_{precision}_offline_gpus.png"
        )
        if plot is not None:
            lines += [
                f"### {model} {fmt} {precision}",
                "",
                f"![offline throughput per GPU]({plot.relative_to(out_dir).as_posix()})",
                "",
            ]
    return "\n".join(lines)
