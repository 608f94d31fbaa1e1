"""Stage 7: the report as markdown: the configuration and hardware, the summary, the published figures beside ours,
then each served format's section (format_section.py: the guides' tables, correctness, accuracy and plots)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tbench.core.metrics import AVG, THROUGHPUT
from tbench.core.shape_sets import guessed_shapes_line
from tbench.core.synthetic import guessed_values_line
from tbench.results.direct_report import direct_lines
from tbench.results.format_section import UNBATCHED, correctness_table, format_section
from tbench.results.pipeline_report import pipeline_lines
from tbench.results.published import (
    PUBLISHED_GPUS,
    PUBLISHED_SIZE,
    compare_with_published,
    load_published,
    published_sizes,
)
from tbench.results.report_plots import plot_formats


def _kv_table(pairs: list[tuple[str, object]]) -> str:
    return pd.DataFrame(pairs, columns=["Parameter Name", "Parameter Value"]).to_markdown(index=False)


def summary_lines(summary: dict) -> list[str]:
    rows = [
        {
            "Format": b["format"],
            "Scenario": b["scenario"],
            **({"Shapes": b["shapes"]} if "shapes" in b else {}),  # a --shape sweep: its best at each shape set
            "Best inferences/second": round(b["best_throughput_infer_per_s"], 1),
            "At": b["at"],
            "P99 latency there (ms)": round(b["p99_ms_at_best"], 3),
            "Lowest avg latency (ms)": round(b["min_avg_ms"], 3),
        }
        for b in summary.get("best", [])
    ]
    lines = [
        f"Measured points: {summary.get('points', 0)}, stable: {summary.get('points_ok', 0)}, "
        f"flagged: {summary.get('points_flagged', 0)}.",
        "",
    ]
    return lines + ([pd.DataFrame(rows).to_markdown(index=False), ""] if rows else [])


def chosen_lines(guessed_shapes: dict | None, guessed_values: dict | None) -> list[str]:
    """The shapes and the integers tbench chose for a model's inputs, said beside the figures that hold for them."""
    lines = [f"**Shapes tbench chose**: {guessed_shapes_line(guessed_shapes)}.", ""] if guessed_shapes else []
    return lines + ([f"**Values tbench chose**: {guessed_values_line(guessed_values)}.", ""] if guessed_values else [])


def published_lines(results: pd.DataFrame) -> list[str]:
    """The guides' published numbers beside ours where the same model, size, scenario, GPU, precision and format
    exist."""
    lines = ["## Compared with the published results", ""]
    both = compare_with_published(results) if not results.empty else pd.DataFrame()
    if both.empty:
        gpus = ", ".join(sorted({str(g) for g in results.get("gpu", pd.Series(dtype=str)).dropna()})) or "this hardware"
        published = load_published()
        sizes = sorted(set(published_sizes(published)[published["model"].isin(set(results.get("model", [])))]))
        return lines + [
            f"The reference guides publish no results for this model on {gpus} at this size, precision and format "
            f"(they cover {', '.join(PUBLISHED_GPUS)}; published sizes of this model: {', '.join(sizes) or 'none'}).",
            "",
        ]
    table = both.rename(
        columns={
            "format": "Format",
            "scenario": "Scenario",
            "batch_size": "Batch",
            "concurrency": "Concurrency",
            THROUGHPUT.column: "Inferences/second",
            f"{THROUGHPUT.column}_published": "Published",
            "throughput_ratio": "Ratio",
            "p99_ms": "P99 (ms)",
            "p99_ms_published": "Published P99",
            "p99_ratio": "P99 ratio",
        }
    )
    columns = [
        "Format",
        "Scenario",
        "Batch",
        "Concurrency",
        "Inferences/second",
        "Published",
        "Ratio",
        "P99 (ms)",
        "Published P99",
        "P99 ratio",
    ]
    return lines + [
        "Matched on model, size, scenario, GPU, precision and format (published rows without a size are the "
        f'published dimensions, size "{PUBLISHED_SIZE}"). Ratios are ours / published: above 1 is more '
        "throughput, or a longer P99.",
        "",
        table[columns].round(3).to_markdown(index=False),
        "",
    ]


def served_on_rows(served_on: dict[str, dict]) -> list[tuple[str, str]]:
    """Where each measured format ran (tbench.serving): the results' gpu label, and why it is not the node's GPU."""
    return [
        (f"Served on ({fmt})", d["label"] + (f": {d['note']}" if d.get("note") else "")) for fmt, d in served_on.items()
    ]


def host_rows(host: dict) -> list[tuple[str, str]]:
    """What the machine did while the sweeps measured (tbench.node.host_load): its CPU probe before and after, other
    processes' CPU and the hypervisor's steal; none for a run that recorded none."""
    rows = []
    speed = host.get("cpu_speed") or {}
    if "start" in speed:
        after = f" before, {speed['end']:.1f} after" if "end" in speed else " before (the run stopped before the end)"
        rows.append(("CPU probe (M steps/s)", f"{speed['start']:.1f}{after}"))
    loads = [
        (host.get(key) or {}, what) for key, what in (("other_cpu_pct", "other processes"), ("steal_pct", "steal"))
    ]
    if any(load for load, _ in loads):
        said = [f"{what} {load['mean']:.1f} (max {load['max']:.1f})" for load, what in loads if load]
        rows.append(("While measuring (% of one CPU)", ", ".join(said)))
    return rows


def render_report(
    *,
    run_id: str,
    request,
    hardware,
    correctness,
    accuracy,
    results: pd.DataFrame,
    summary: dict,
    stage_seconds: dict[str, float],
    plots_dir: Path,
    status: str = "completed",
    error: str | None = None,
    served_by: dict[str, str] | None = None,
    composing: pd.DataFrame | None = None,
    steps: pd.DataFrame | None = None,
    model_notes: list[str] | None = None,
    comparison_lines: list[str] | None = None,
    served_on: dict[str, dict] | None = None,
    measured_shapes: list[str] | None = None,
    guessed_shapes: dict[str, list[int]] | None = None,
    guessed_values: dict[str, str] | None = None,
    direct: list[dict] | None = None,
    tensors: dict[str, str] | None = None,
    host: dict | None = None,
) -> str:
    served_by = served_by or {}
    title = request.model_file or f"{request.model} ({request.size}, {request.framework})"
    lines = [
        f"# Triton benchmark: {title}",
        "",
        f"Run `{run_id}`, status **{status}**" + (f": {error}" if error else "") + ".",
        "",
    ]
    lines += [
        "## Configuration",
        "",
        _kv_table(
            [
                ("Model", title),
                (
                    "Checkpoint",
                    request.checkpoint or ("the file's weights" if request.model_file else "random weights"),
                ),
                *([("Input data", request.input_data)] if getattr(request, "input_data", None) else []),
                *(
                    [
                        (
                            "Synthetic value ranges",
                            ", ".join(f"{n}: {lo:g}..{hi:g}" for n, (lo, hi) in request.value_ranges.items()),
                        )
                    ]
                    if getattr(request, "value_ranges", None)
                    else []
                ),
                *([("Dynamic dims", "; ".join(measured_shapes))] if measured_shapes else []),
                ("Exported formats", ", ".join(f.value for f in request.formats)),
                (
                    "Served formats",
                    ", ".join(
                        f"{f.value} ({served_by.get(f.value, 'not served: the run stopped before')})"
                        for f in request.serve_formats
                    ),
                ),
                ("Requested precision", request.precision.value.upper()),  # the tables: what each format served
                (
                    "Max Batch Size",
                    request.max_batch_size or f"0 (no batch axis: each request is {UNBATCHED})",
                ),
                ("Number of model instances", request.model_instances),
                ("Triton Max Queue Delay (us)", request.max_queue_delay_us),
                ("Triton Preferred Batch Sizes", " ".join(map(str, request.preferred_batch_sizes))),
                ("Profile", request.profile),
            ]
        ),
        "",
        *(model_notes or []),
        "## Hardware",
        "",
        _kv_table(
            [
                ("CPU", hardware.cpu_model),
                ("CPU cores", hardware.cpu_cores),
                ("Memory (GiB)", hardware.memory_gib),
                ("GPUs of the node", ", ".join(hardware.gpus) or "none"),
                ("Driver", hardware.driver or "-"),
                ("OS", hardware.os),
                *served_on_rows(served_on or {}),
                *host_rows(host or {}),
            ]
        ),
        "",
    ]
    lines += ["## Summary", "", *summary_lines(summary)]
    lines += chosen_lines(guessed_shapes, guessed_values)
    if not results.empty and results.loc[results["status"] == "ok", "format"].nunique() > 1:
        lines += [f"![]({plot_formats(results, plots_dir).relative_to(plots_dir.parent).as_posix()})", ""]
    lines += published_lines(results)
    lines += direct_lines(direct or [])
    lines += comparison_lines or []
    if correctness:
        served = {f.value for f in request.serve_formats}
        exported_only = [c for c in correctness if c.format.value not in served and not c.model]
        lines += [
            "## Correctness of the exported models",
            "",
            f"Each format against the source model on one sample batch; pass when max abs error <= "
            f"{request.tolerance_atol:g} + {request.tolerance_rtol:g} x max|reference|. Served formats have "
            "theirs in their own section" + ("; the formats exported but not served:" if exported_only else "."),
            "",
        ]
        if exported_only:
            lines += [correctness_table(exported_only), ""]
    by_format_correctness = {c.format.value: [c] for c in correctness or [] if not c.model}
    by_format_correctness["ensemble"] = [c for c in correctness or [] if c.model]  # its composing models' checks
    by_format_accuracy = {a.format.value: a for a in accuracy or [] if a.format}
    for fmt in (f.value for f in request.serve_formats):
        lines += format_section(
            fmt,
            served_by.get(fmt, "not decided (the run stopped before the server stage)"),
            by_format_correctness.get(fmt, []),
            by_format_accuracy.get(fmt),
            results,
            plots_dir,
            composing,
            request.online_batch_size,
            batching=request.max_batch_size > 0,
            tensors=(tensors or {}).get(fmt),
        )
    lines += pipeline_lines(steps, results, plots_dir)  # an ensemble's steps from Triton's statistics
    lines += closing_lines(results, stage_seconds)
    return "\n".join(lines)


def closing_lines(results: pd.DataFrame, stage_seconds: dict[str, float]) -> list[str]:
    """The end of every report: the flagged points, the stage timings and the units."""
    lines: list[str] = []
    if not results.empty:
        flagged = results[results["status"] != "ok"]
        if not flagged.empty:
            lines += [
                "## Flagged points",
                "",
                "Measured but not reported above: they did not stabilise or failed.",
                "",
                flagged[
                    ["format", "scenario", "batch_size", "concurrency", "request_rate", "status", "attempts", "error"]
                ].to_markdown(index=False),
                "",
            ]
    if stage_seconds:
        lines += [
            "## Stage timings",
            "",
            pd.DataFrame([{"Stage": k, "Seconds": round(v, 1)} for k, v in stage_seconds.items()]).to_markdown(
                index=False
            ),
            "",
        ]
    lines += [f"Latencies are in milliseconds; {AVG.header} is perf_analyzer's average client latency.", ""]
    return lines
