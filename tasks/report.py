"""Stage 7: the guides' tables, the configuration and hardware, correctness, accuracy and plots, as markdown."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no screen on workers
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from prefect import task  # noqa: E402
from prefect.artifacts import create_markdown_artifact, create_table_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from tbench.metrics import AVG, BREAKDOWN, PERCENTILES, THROUGHPUT  # noqa: E402

OFFLINE_COLUMNS = {"precision": "Precision", "backend_accelerator": "Backend Accelerator", "batch_size": "Client Batch Size",
                   THROUGHPUT.column: THROUGHPUT.header,
                   **{m.column: m.header for m in PERCENTILES if m.column != "p50_ms"}, AVG.column: AVG.header}
ONLINE_COLUMNS = {"concurrency": "Concurrent client requests", THROUGHPUT.column: THROUGHPUT.header,
                  **{m.column: m.header for m in BREAKDOWN}, **{m.column: m.header for m in PERCENTILES}, AVG.column: AVG.header}


def scenario_rows(results: pd.DataFrame, scenario: str, ok_only: bool = True) -> pd.DataFrame:
    rows = results[results["scenario"] == scenario]
    if ok_only:
        rows = rows[rows["status"] == "ok"]
    return rows.sort_values("batch_size" if scenario == "offline" else "concurrency")


def guide_table(rows: pd.DataFrame, columns: dict[str, str]) -> str:
    table = rows[list(columns)].rename(columns=columns).copy()
    for col in table.columns:
        if pd.api.types.is_float_dtype(table[col]):
            table[col] = table[col].round(3)
    return table.fillna("").to_markdown(index=False)


def plot_offline(rows: pd.DataFrame, plots_dir: Path) -> list[Path]:
    batch = rows["batch_size"].astype(str)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(batch, rows[THROUGHPUT.column], color="#76b900")
    ax.set(xlabel="Client batch size", ylabel="Inferences/second", title="Offline: throughput vs batch size")
    fig.tight_layout()
    left = plots_dir / "offline_throughput_vs_batch.png"
    fig.savefig(left, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in [*PERCENTILES[1:], AVG]:
        ax.plot(batch, rows[m.column], marker="o", label=m.header)
    ax.set(xlabel="Client batch size", ylabel="Latency (ms)", title="Offline: latency vs batch size")
    ax.legend()
    fig.tight_layout()
    right = plots_dir / "offline_latency_vs_batch.png"
    fig.savefig(right, dpi=110)
    plt.close(fig)
    return [left, right]


def plot_online(rows: pd.DataFrame, plots_dir: Path) -> list[Path]:
    conc = rows["concurrency"].astype(str)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bottom = pd.Series(0.0, index=rows.index)
    for m in BREAKDOWN:
        values = rows[m.column].fillna(0.0)
        ax.bar(conc, values, bottom=bottom, label=m.header)
        bottom = bottom + values
    ax.set(xlabel="Concurrent client requests", ylabel="Latency (ms)", title="Online: latency breakdown and throughput vs concurrency")
    ax2 = ax.twinx()
    ax2.plot(conc, rows[THROUGHPUT.column], color="black", marker="o", label=THROUGHPUT.header)
    ax2.set_ylabel("Inferences/second")
    ax2.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper left")
    fig.tight_layout()
    path = plots_dir / "online_latency_breakdown_throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _kv_table(pairs: list[tuple[str, object]]) -> str:
    return pd.DataFrame(pairs, columns=["Parameter Name", "Parameter Value"]).to_markdown(index=False)


def summary_lines(summary: dict) -> list[str]:
    rows = []
    for scenario, axis in (("offline", "batch size"), ("online", "concurrency")):
        best = summary.get(scenario)
        if best:
            at = best.get("at_batch_size", best.get("at_concurrency"))
            rows.append({"Scenario": scenario, "Best inferences/second": round(best["best_throughput_infer_per_s"], 1),
                         "At": f"{axis} {at}", "P99 latency there (ms)": round(best["p99_ms_at_best"], 3),
                         "Lowest avg latency (ms)": round(best["min_avg_ms"], 3)})
    lines = [f"Measured points: {summary.get('points', 0)}, stable: {summary.get('points_ok', 0)}, "
             f"flagged: {summary.get('points_flagged', 0)}.", ""]
    return lines + ([pd.DataFrame(rows).to_markdown(index=False), ""] if rows else [])


def render_report(*, run_id: str, request, hardware, correctness, accuracy, results: pd.DataFrame, summary: dict,
                  stage_seconds: dict[str, float], plots_dir: Path, status: str = "completed", error: str | None = None,
                  served_by: str | None = None) -> str:
    run_dir = plots_dir.parent
    lines = [f"# Triton benchmark: {request.model} ({request.size})", "",
             f"Run `{run_id}`, status **{status}**" + (f": {error}" if error else "") + ".", ""]
    lines += ["## Configuration", "", _kv_table([
        ("Model", f"{request.model} ({request.size})"),
        ("Checkpoint", request.checkpoint or "random weights"),
        ("Served format", request.serve_format.value),
        ("Served by", served_by or "not decided (the run stopped before the server stage)"),
        ("Precision", request.precision.value.upper()),
        ("Max Batch Size", request.max_batch_size),
        ("Number of model instances", request.model_instances),
        ("Triton Max Queue Delay (us)", request.max_queue_delay_us),
        ("Triton Preferred Batch Sizes", " ".join(map(str, request.preferred_batch_sizes))),
        ("Profile", request.profile),
    ]), "", "## Hardware", "", _kv_table([
        ("CPU", hardware.cpu_model), ("CPU cores", hardware.cpu_cores), ("Memory (GiB)", hardware.memory_gib),
        ("GPU", ", ".join(hardware.gpus) or "none"), ("Driver", hardware.driver or "-"), ("OS", hardware.os),
    ]), ""]
    lines += ["## Summary", "", *summary_lines(summary)]
    if correctness:
        lines += ["## Correctness of the exported models", "",
                  f"Each format against the framework model on one sample batch; pass when max abs error <= "
                  f"{request.tolerance_atol:g} + {request.tolerance_rtol:g} x max|reference|.", ""]
        rows = [{"Format": c.format.value, "Output": o.output, "Max abs error": f"{o.max_abs_err:.3g}",
                 "Max rel error": f"{o.max_rel_err:.3g}", "Tolerance": f"{o.tolerance:.3g}", "Passed": "yes" if o.passed else "NO"}
                for c in correctness for o in c.outputs]
        lines += [pd.DataFrame(rows).to_markdown(index=False), ""]
    if accuracy:
        lines += ["## Accuracy through Triton", "", pd.DataFrame([{
            "Metric": accuracy.metric, "Samples": accuracy.samples, "Framework": f"{accuracy.framework:.4f}",
            "Triton": f"{accuracy.triton:.4f}", "Difference": f"{accuracy.difference:+.4f}",
            "Prediction agreement": f"{accuracy.agreement:.4f}"}]).to_markdown(index=False), ""]
    if not results.empty:
        offline = scenario_rows(results, "offline")
        if not offline.empty:
            left, right = (p.relative_to(run_dir).as_posix() for p in plot_offline(offline, plots_dir))
            lines += ["## Offline scenario", "", "Static batching: one client (concurrency 1), system shared memory.", "",
                      f"| ![]({left}) | ![]({right}) |", "|-----|-----|", "", guide_table(offline, OFFLINE_COLUMNS), ""]
        online = scenario_rows(results, "online")
        if not online.empty:
            (plot,) = (p.relative_to(run_dir).as_posix() for p in plot_online(online, plots_dir))
            lines += ["## Online scenario", "", "Dynamic batching on the server; each client sends batch 1 over gRPC.", "",
                      f"![]({plot})", "", guide_table(online, ONLINE_COLUMNS), ""]
        flagged = results[results["status"] != "ok"]
        if not flagged.empty:
            lines += ["## Flagged points", "", "Measured but not reported above: they did not stabilise or failed.", "",
                      flagged[["scenario", "batch_size", "concurrency", "status", "attempts", "error"]].to_markdown(index=False), ""]
    if stage_seconds:
        lines += ["## Stage timings", "", pd.DataFrame(
            [{"Stage": k, "Seconds": round(v, 1)} for k, v in stage_seconds.items()]).to_markdown(index=False), ""]
    lines += [f"Latencies are in milliseconds; {AVG.header} is perf_analyzer's average client latency.", ""]
    return "\n".join(lines)


@task(name="report", cache_policy=NO_CACHE)
def report_task(report_path: Path, results: pd.DataFrame, **kwargs) -> Path:
    text = render_report(results=results, **kwargs)
    report_path.write_text(text)
    create_markdown_artifact(text, key="benchmark-report", description="Benchmark report (plots are in the run folder)")
    if not results.empty:
        create_table_artifact(results.astype(object).where(results.notna(), "").to_dict(orient="records"),
                              key="benchmark-results", description="Tidy perf_analyzer results")
    return report_path
