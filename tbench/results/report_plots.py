"""The run report's plots (tbench.results.report puts them in the markdown): each writes its PNG into the run's plots
folder and returns its path."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no screen on workers
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from tbench.core.metrics import AVG, BREAKDOWN, PERCENTILES, THROUGHPUT


def _throughput_on_twin_axis(ax, x, rows: pd.DataFrame, **style):
    """Throughput in black on a second y axis, one legend for both axes; returns the second axis."""
    ax2 = ax.twinx()
    ax2.plot(x, rows[THROUGHPUT.column], color="black", label=THROUGHPUT.header, **style)
    ax2.set_ylabel("Inferences/second")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper left")
    return ax2


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_offline(rows: pd.DataFrame, plots_dir: Path, prefix: str = "") -> list[Path]:
    batch = rows["batch_size"].astype(str)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(batch, rows[THROUGHPUT.column], color="#76b900")
    ax.set(xlabel="Client batch size", ylabel="Inferences/second", title="Offline: throughput vs batch size")
    left = _save(fig, plots_dir / f"{prefix}offline_throughput_vs_batch.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in [*PERCENTILES[1:], AVG]:
        ax.plot(batch, rows[m.column], marker="o", label=m.header)
    ax.set(xlabel="Client batch size", ylabel="Latency (ms)", title="Offline: latency vs batch size")
    ax.legend()
    right = _save(fig, plots_dir / f"{prefix}offline_latency_vs_batch.png")
    return [left, right]


def plot_online(rows: pd.DataFrame, plots_dir: Path, prefix: str = "") -> list[Path]:
    conc = rows["concurrency"].astype(str)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bottom = pd.Series(0.0, index=rows.index)
    for m in BREAKDOWN:
        values = rows[m.column].fillna(0.0)
        ax.bar(conc, values, bottom=bottom, label=m.header)
        bottom = bottom + values
    ax.set(
        xlabel="Concurrent client requests",
        ylabel="Latency (ms)",
        title="Online: latency breakdown and throughput vs concurrency",
    )
    _throughput_on_twin_axis(ax, conc, rows, marker="o").set_ylim(bottom=0)
    return [_save(fig, plots_dir / f"{prefix}online_latency_breakdown_throughput.png")]


def plot_formats(results: pd.DataFrame, plots_dir: Path) -> Path:
    """Every served format on one chart per scenario: which format to deploy is the first question."""
    ok = results[results["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, scenario, axis, label in (
        (axes[0], "offline", "batch_size", "Client batch size"),
        (axes[1], "online", "concurrency", "Concurrent client requests"),
    ):
        for fmt, rows in ok[ok["scenario"] == scenario].groupby("format", sort=False):
            rows = rows.sort_values(axis)
            ax.plot(rows[axis], rows[THROUGHPUT.column], marker="o", label=fmt)
        ax.set(xlabel=label, ylabel="Inferences/second", title=f"{scenario.capitalize()}: throughput by format")
        ax.set_ylim(bottom=0)
        if ax.has_data():
            ax.legend()
    return _save(fig, plots_dir / "formats_throughput.png")


def plot_rate(rows: pd.DataFrame, plots_dir: Path, prefix: str = "") -> Path:
    """Open loop: latency percentiles and achieved throughput against the offered request rate."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in [*PERCENTILES, AVG]:
        ax.plot(rows["request_rate"], rows[m.column], marker="o", label=m.header)
    ax.set(xlabel="Offered request rate (1/s)", ylabel="Latency (ms)", title="Rate: latency vs offered load")
    # served requests/s (throughput / batch) against the offered requests/s, on the same scale: with a batch of b
    # per request the throughput is b x the rate, and never below it even when the server fell behind
    ax2 = ax.twinx()
    served = rows[THROUGHPUT.column] / rows["batch_size"]
    ax2.plot(rows["request_rate"], served, color="black", linestyle="--", marker="s", label="Served requests/s")
    ax2.plot(rows["request_rate"], rows["request_rate"], color="grey", linewidth=0.8, label="Offered requests/s")
    ax2.set_ylabel("Requests/second")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper left")
    return _save(fig, plots_dir / f"{prefix}rate_latency_vs_load.png")


def plot_composing(rows: pd.DataFrame, plots_dir: Path, prefix: str = "") -> Path:
    """Where an ensemble's server time goes: each composing model's request latency, stacked, per batch."""
    table = rows.pivot_table(
        index="batch_size", columns="composing_model", values="request_latency_ms", aggfunc="mean", sort=False
    ).sort_index()
    fig, ax = plt.subplots(figsize=(7, 4))
    table.plot.bar(stacked=True, ax=ax, rot=0)
    ax.set(xlabel="Batch", ylabel="Server request latency (ms)", title="Offline: latency per composing model")
    return _save(fig, plots_dir / f"{prefix}composing_latency.png")


def plot_shapes(rows: pd.DataFrame, plots_dir: Path, prefix: str = "") -> Path:
    """A --shape sweep: throughput and p99 latency against the measured shapes (in the order measured), one line per
    offline batch size and per online concurrency: how the model scales with sequence length."""
    order = list(dict.fromkeys(rows["shapes"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (scenario, batch, conc), line in rows.groupby(["scenario", "batch_size", "concurrency"], sort=True):
        line = line.set_index("shapes").reindex(order)
        label = f"{scenario} b{batch}" + (f" c{conc:g}" if scenario != "offline" else "")
        left.plot(order, line[THROUGHPUT.column], marker="o", label=label)
        right.plot(order, line["p99_ms"], marker="o", label=label)
    left.set(xlabel="Shapes", ylabel="Inferences/second", title="Throughput vs shape")
    right.set(xlabel="Shapes", ylabel="P99 latency (ms)", title="P99 latency vs shape")
    for ax in (left, right):
        ax.set_ylim(bottom=0)
        ax.tick_params(axis="x", labelrotation=20)
        if ax.has_data():
            ax.legend(fontsize="small")
    return _save(fig, plots_dir / f"{prefix}shapes_throughput_p99.png")


def plot_steps_busy(rows: pd.DataFrame, points: list[str], plots_dir: Path) -> Path:
    """A pipeline's steps: how busy each one's instances were at each point (`rows` labelled by `point`), against the
    line past which a step is full: the tallest bar at the best point is what bounds the pipeline."""
    table = rows.pivot_table(index="point", columns="step", values="busy_pct", aggfunc="mean", sort=False)
    table = table.reindex([p for p in points if p in table.index])
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(table) + 3), 4))
    table.plot.bar(ax=ax, rot=20)
    ax.axhline(100, color="black", linewidth=0.8, linestyle="--")
    ax.set(xlabel="Point", ylabel="Instances busy (%)", title="Where the pipeline spends its time: busy per step")
    ax.set_ylim(0, max(110.0, float(table.max().max()) * 1.05 if table.size else 110.0))
    ax.legend(fontsize="small")
    return _save(fig, plots_dir / "pipeline_steps_busy.png")
