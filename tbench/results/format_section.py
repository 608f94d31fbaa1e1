"""One served format's section of a report: how it is served, its correctness and accuracy, and per scenario the
guides' table and plots, then the server's side, its composing models and any --shape sweep."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from tbench.core.metrics import AVG, BREAKDOWN, PERCENTILES, THROUGHPUT
from tbench.results.arrivals_report import arrivals_lines
from tbench.results.report_plots import plot_composing, plot_offline, plot_online, plot_rate, plot_shapes

OFFLINE_COLUMNS = {
    "precision": "Precision",
    "backend_accelerator": "Backend Accelerator",
    "batch_size": "Client Batch Size",
    THROUGHPUT.column: THROUGHPUT.header,
    **{m.column: m.header for m in PERCENTILES if m.column != "p50_ms"},
    AVG.column: AVG.header,
}
ONLINE_COLUMNS = {
    "concurrency": "Concurrent client requests",
    THROUGHPUT.column: THROUGHPUT.header,
    **{m.column: m.header for m in BREAKDOWN},
    **{m.column: m.header for m in PERCENTILES},
    AVG.column: AVG.header,
}


RATE_COLUMNS = {
    "request_rate": "Request rate (1/s)",
    "request_distribution": "Arrivals",
    THROUGHPUT.column: THROUGHPUT.header,
    **{m.column: m.header for m in BREAKDOWN},
    **{m.column: m.header for m in PERCENTILES},
    AVG.column: AVG.header,
}
SORT_BY = {"offline": "batch_size", "online": "concurrency", "rate": "request_rate"}


def scenario_rows(results: pd.DataFrame, scenario: str, ok_only: bool = True) -> pd.DataFrame:
    rows = results[results["scenario"] == scenario]
    if ok_only:
        rows = rows[rows["status"] == "ok"]
    return rows.sort_values(SORT_BY[scenario])


def guide_table(rows: pd.DataFrame, columns: dict[str, str]) -> str:
    table = rows[list(columns)].rename(columns=columns).copy()
    for col in table.columns:
        if pd.api.types.is_float_dtype(table[col]):
            table[col] = table[col].round(3)
    return table.fillna("").to_markdown(index=False)


def correctness_table(results) -> str:
    rows = [
        {
            "Format": c.format.value + (f" ({c.model})" if c.model else ""),
            "Output": o.output,
            "Max abs error": f"{o.max_abs_err:.3g}",
            "Max rel error": f"{o.max_rel_err:.3g}",
            "Tolerance": f"{o.tolerance:.3g}",
            "Passed": "yes" if o.passed else "NO",
        }
        for c in results
        for o in c.outputs
    ]
    return pd.DataFrame(rows).to_markdown(index=False)


def accuracy_lines(result) -> list[str]:
    lines = [
        f"Through Triton vs the source model on the same {result.samples} samples:",
        "",
        pd.DataFrame(
            [
                {
                    "Output": o.output,
                    "Max abs error": f"{o.max_abs_err:.3g}",
                    "Max rel error": f"{o.max_rel_err:.3g}",
                    "Tolerance": f"{o.tolerance:.3g}",
                    "Same answers": "yes" if o.passed else "NO",
                }
                for o in result.outputs
            ]
        ).to_markdown(index=False),
        "",
    ]
    if result.metric:
        lines += [
            pd.DataFrame(
                [
                    {
                        "Metric": result.metric,
                        "Samples": result.samples,
                        "Framework": f"{result.framework:.4f}",
                        "Triton": f"{result.triton:.4f}",
                        "Difference": f"{result.difference:+.4f}",
                        "Prediction agreement": f"{result.agreement:.4f}",
                    }
                ]
            ).to_markdown(index=False),
            "",
        ]
    return lines


COMPOSING_TABLE = {
    "scenario": "Scenario",
    "batch_size": "Batch",
    "concurrency": "Concurrency",
    "composing_model": "Composing model",
    "server_queue_ms": "Server Queue",
    "server_compute_input_ms": "Server Compute Input",
    "server_compute_infer_ms": "Server Compute Infer",
    "server_compute_output_ms": "Server Compute Output",
    "request_latency_ms": "Request latency",
}


def composing_lines(composing: pd.DataFrame, plots_dir: Path, prefix: str) -> list[str]:
    """An ensemble's own rows per composing model, as perf_analyzer reports them; latencies in ms."""
    lines = [
        "### Composing models",
        "",
        "Each step of the ensemble at every measured point: its own queue and compute "
        "times on the server (perf_analyzer's composing-model statistics).",
        "",
    ]
    offline = composing[composing["scenario"] == "offline"]
    if not offline.empty:
        lines += [f"![]({plot_composing(offline, plots_dir, prefix).relative_to(plots_dir.parent).as_posix()})", ""]
    columns = [c for c in COMPOSING_TABLE if c != "concurrency" or composing[c].notna().any()]
    composing = composing.sort_values(["scenario", "batch_size", "concurrency", "composing_model"])
    return lines + [composing[columns].rename(columns=COMPOSING_TABLE).round(3).to_markdown(index=False), ""]


SERVER_TABLE = {
    "scenario": "Scenario",
    "batch_size": "Batch",
    "concurrency": "Concurrency",
    "request_rate": "Rate",
    "triton_requests": "Requests",
    "triton_queue_ms": "Queue (ms)",
    "triton_compute_infer_ms": "Compute infer (ms)",
    "stats_max_rel_diff": "Max diff vs client",
    "triton_hist_mean_ms": "Histogram mean (ms)",
    "triton_hist_p50_ms": "Histogram p50 (ms)",
    "triton_hist_p99_ms": "Histogram p99 (ms)",
    "server_cpu_pct": "Server CPU %",
    "server_rss_mb": "Server RSS (MB)",
    "gpu_util_pct": "GPU util %",
    "gpu_mem_mb": "GPU memory (MB)",
    "gpu_power_w": "GPU power (W)",
}


def server_lines(rows: pd.DataFrame) -> list[str]:
    """Each stable point from the server's side: Triton's statistics API over the point, how far it is from
    perf_analyzer's server breakdown, the server's CPU (100 = one core) and memory, and GPU metrics where there are
    GPUs."""
    ok = rows[rows["status"] == "ok"].sort_values(["scenario", "batch_size", "concurrency", "request_rate"])
    columns = [c for c in SERVER_TABLE if c in ok.columns and ok[c].notna().any()]
    if ok.empty or "triton_requests" not in columns:
        return []
    table = ok[columns].rename(columns=SERVER_TABLE).round(3)
    if "Max diff vs client" in table:
        table["Max diff vs client"] = (100 * ok["stats_max_rel_diff"]).round(1).astype(str) + " %"
    histogram = ""
    if "triton_hist_mean_ms" in columns:  # only where the server exposes its latency histogram
        histogram = (
            " The histogram columns are the server's own request-to-first-response histogram diffed over the point: "
            "its mean exactly, its p50 and p99 interpolated in the bucket that holds them"
            + (
                "."
                if "triton_hist_p99_ms" in columns
                else " (empty here: its buckets are too wide to place them; Triton's default ones are 100, 500, 2000 "
                "and 5000 ms)."
            )
        )
    return [
        "### Server side",
        "",
        "Triton's statistics API over each point (per request), its largest difference from "
        "perf_analyzer's server-side breakdown (which reads the same API over its measurement windows only), and the "
        "server's processes sampled during the point." + histogram,
        "",
        table.to_markdown(index=False),
        "",
    ]


UNBATCHED = "one call of the model at its own input shapes (max_batch_size 0)"


def shared_memory_words(kind: str) -> str:
    """How the offline scenario's tensors travel: in shared memory, or over gRPC where the server may be elsewhere."""
    return "tensors over gRPC (no shared memory)" if kind == "none" else f"{kind} shared memory"


def how_measured(rows: pd.DataFrame) -> str:
    """What a quoted figure rests on: window length, stability rule, precision served."""
    windows = rows["window_s"].dropna()
    span = (
        f"{windows.min():.1f}-{windows.max():.1f} s"
        if len(windows) and windows.min() != windows.max()
        else (f"{windows.iloc[0]:.1f} s" if len(windows) else "unknown")
    )
    return (
        f"Measured over windows of {span}, the last 3 within {rows['stability_percentage'].iloc[0]:g}%; "
        f"precision served: {', '.join(sorted(set(rows['precision'].astype(str))))}."
    )


QUEUE_SHARE = 0.5  # of a point's mean latency: beyond it the batcher's wait, not the model, set the point


def queue_wait_lines(online: pd.DataFrame) -> list[str]:
    """Online points whose mean latency was mostly the dynamic batcher's wait for a batch too few clients fill (the
    queue at half the configured delay or more): said, with the option that shortens the wait."""
    delay_us = float(online["max_queue_delay_us"].iloc[0])
    if not delay_us > 0:
        return []
    queue, avg = online["server_queue_ms"], online["avg_ms"]
    waited = online[(queue >= QUEUE_SHARE * avg) & (queue >= 0.5 * delay_us / 1000)].sort_values("concurrency")
    if waited.empty:
        return []
    points = "; ".join(
        f"concurrency {p['concurrency']:g}: {p['server_queue_ms']:.2f} of {p['avg_ms']:.2f} ms"
        for _, p in waited.iterrows()
    )
    return [
        f"**Note**: most of these requests' latency was the server's queue ({points}): the dynamic batcher waits up to "
        f"{delay_us:g} us for a batch that so few clients do not fill. A smaller `--queue-delay-us` serves low "
        "concurrency faster, at some cost in throughput where many clients do fill batches.",
        "",
    ]


FELL_SIGMAS = 2.0  # a drop beyond this many times the two points' combined window CV is the model's, not noise
FELL_MIN = 0.02  # and beyond this share: windows that happen to agree closely do not turn 1% into a finding


def batch_fall_lines(offline: pd.DataFrame) -> list[str]:
    """Offline batch sizes that served fewer inferences per second than the next smaller one, beyond both points' window
    noise (throughput_cv): said, with the batch to prefer, since a larger batch is what a user would reach for."""
    lines = []
    for _, group in offline.groupby(["precision", "model_instances"], dropna=False):
        by_batch = group.groupby("batch_size")[[THROUGHPUT.column, "throughput_cv"]].median().sort_index()
        by_batch["throughput_cv"] = by_batch["throughput_cv"].fillna(0.0)  # a point without windows adds no noise
        best = by_batch[THROUGHPUT.column].idxmax()
        rows = list(by_batch.itertuples())
        for (small, t_small, cv_small), (large, t_large, cv_large) in zip(rows, rows[1:]):
            noise = math.hypot(cv_small, cv_large)
            drop = 1 - t_large / t_small
            if drop > max(FELL_MIN, FELL_SIGMAS * noise):
                lines += [
                    f"**Note**: batch {large:g} served {drop:.0%} fewer inferences per second than batch {small:g} "
                    f"({t_small:,.1f} -> {t_large:,.1f}, beyond the windows' ±{noise:.1%}): on this machine this "
                    f"model's work grew faster than its batch there, so a larger batch does not pay; its best offline "
                    f"point is batch {best:g}.",
                    "",
                ]
    return lines


def format_section(
    fmt: str,
    served_by: str,
    correctness,
    accuracy,
    results: pd.DataFrame,
    plots_dir: Path,
    composing: pd.DataFrame | None = None,
    online_batch_size: int = 1,
    batching: bool = True,
    served_as: str | None = None,
    tensors: str | None = None,
) -> list[str]:
    """One served format: how it is served, its correctness and accuracy, and the guides' tables and plots.
    `served_as`: how a model someone else serves batches, said of every scenario in place of tbench's own configs.
    `tensors`: the path the python-backend runtime's tensors took (DLPack or NumPy, and why), where it served it."""
    run_dir = plots_dir.parent
    lines = [f"## Format `{fmt}`", "", f"Served by: {served_by}.", ""]
    if tensors:
        lines += [f"Tensors: {tensors}.", ""]
    if correctness:
        lines += ["### Correctness", "", correctness_table(correctness), ""]
    if accuracy:
        lines += ["### Accuracy through Triton", "", *accuracy_lines(accuracy)]
    rows = results[results["format"] == fmt] if not results.empty else results
    swept = rows[rows["status"] == "ok"] if not rows.empty else rows
    if not swept.empty and swept["shapes"].nunique() > 1:  # a --shape sweep: its own section; below, its first set
        lines += shape_lines(swept, plots_dir, f"{fmt}_")
        rows = rows[rows["shapes"] == swept["shapes"].iloc[0]]
    offline = scenario_rows(rows, "offline") if not rows.empty else rows
    if not offline.empty:
        left, right = (p.relative_to(run_dir).as_posix() for p in plot_offline(offline, plots_dir, f"{fmt}_"))
        lines += [
            "### Offline scenario",
            "",
            (
                served_as
                or (
                    "Static batching (the model served without its dynamic batcher, so no queue delay)"
                    if batching
                    else f"No batch sweep: the model has no batch axis, so each request is {UNBATCHED}"
                )
            )
            + f": one client (concurrency 1), {shared_memory_words(offline['shared_memory'].iloc[0])}. "
            f"{how_measured(offline)}",
            "",
            f"| ![]({left}) | ![]({right}) |",
            "|-----|-----|",
            "",
            guide_table(offline, OFFLINE_COLUMNS),
            "",
            *(batch_fall_lines(offline) if batching else []),
        ]
    lines += flagged_only_lines(rows, "offline", offline)
    online = scenario_rows(rows, "online") if not rows.empty else rows
    if not online.empty:
        (plot,) = (p.relative_to(run_dir).as_posix() for p in plot_online(online, plots_dir, f"{fmt}_"))
        lines += [
            "### Online scenario",
            "",
            (
                f"{served_as}; each client sends batch {online_batch_size} over gRPC. "
                if served_as
                else f"Dynamic batching on the server (max queue delay {online['max_queue_delay_us'].iloc[0]:g} us); "
                f"each client sends batch {online_batch_size} over gRPC. "
                if batching
                else f"No batching (the model has no batch axis): each request is {UNBATCHED}, sent over gRPC. "
            )
            + how_measured(online),
            "",
            f"![]({plot})",
            "",
            guide_table(online, ONLINE_COLUMNS),
            "",
            *(queue_wait_lines(online) if batching and not served_as else []),
        ]
    lines += flagged_only_lines(rows, "online", online)
    rate = scenario_rows(rows, "rate") if not rows.empty else rows
    if not rate.empty:
        plot = plot_rate(rate, plots_dir, f"{fmt}_").relative_to(run_dir).as_posix()
        lines += [
            "### Rate scenario",
            "",
            "Open loop: requests sent at a fixed rate whatever the answers, "
            + (
                f"batch {online_batch_size}, {served_as}"
                if served_as
                else f"batch {online_batch_size}, dynamic batching on the server"
                if batching
                else f"each request {UNBATCHED}, no batching"
            )
            + "; served requests/s (throughput / batch size, the plot's dashed line) below the offered rate means "
            "the server fell behind: a point that did not keep up is marked behind, or undetermined when its windows "
            "could not tell. "
            f"{how_measured(rate)}",
            "",
            f"![]({plot})",
            "",
            guide_table(rate, RATE_COLUMNS),
            "",
        ]
    lines += flagged_only_lines(rows, "rate", rate)
    if not rows.empty:
        # every scheduled point's picture, flagged ones too, also where none is ok (every point client-bound on a
        # busy machine): one that fell behind or could not be sent on time is the one whose offered and served rates
        # a user wants to see
        lines += arrivals_lines(scenario_rows(rows, "rate", ok_only=False), run_dir, plots_dir, f"{fmt}_")
        lines += server_lines(rows)
    if composing is not None and not composing.empty:
        lines += composing_lines(composing[composing["format"] == fmt], plots_dir, f"{fmt}_")
    return lines


def shape_lines(rows: pd.DataFrame, plots_dir: Path, prefix: str) -> list[str]:
    """A --shape sweep: every stable point by shape, and the plot of throughput and p99 against shape."""
    plot = plot_shapes(rows, plots_dir, prefix).relative_to(plots_dir.parent).as_posix()
    columns = {
        "shapes": "Shapes",
        "scenario": "Scenario",
        "batch_size": "Client Batch Size",
        "concurrency": "Concurrent client requests",
        THROUGHPUT.column: THROUGHPUT.header,
        "p99_ms": "P99 Latency",
        AVG.column: AVG.header,
    }
    table = rows.sort_values(["scenario", "batch_size", "concurrency"], kind="stable")[list(columns)]
    first = rows["shapes"].iloc[0]
    return [
        "### By shape",
        "",
        f"The shapes swept ({rows['shapes'].nunique()} sets), each measured at every point below; the scenario "
        f"sections after this one show the first set ({first}).",
        "",
        f"![]({plot})",
        "",
        table.rename(columns=columns).round(3).to_markdown(index=False),
        "",
    ]


def flagged_only_lines(rows: pd.DataFrame, scenario: str, ok: pd.DataFrame) -> list[str]:
    """A scenario that was measured but has no point within its checks still has its section, saying so: never a
    silently missing scenario."""
    if not ok.empty or rows.empty:
        return []
    measured = rows[rows["scenario"] == scenario]
    if measured.empty:
        return []
    statuses = ", ".join(f"{n} {status}" for status, n in measured["status"].value_counts().items())
    return [
        f"### {scenario.title()} scenario",
        "",
        f"No point of this scenario passed its checks ({statuses}): each is listed under Flagged points, with why.",
        "",
    ]
