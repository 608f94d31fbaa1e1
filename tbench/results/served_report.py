"""The report of a model someone else serves (flows/served.py): the server and the model as they are served, what
was not measured and why, then the same summary, scenario tables and plots as every run's report."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tbench.results.pipeline_report import pipeline_lines
from tbench.results.report import UNBATCHED, _kv_table, chosen_lines, closing_lines, format_section, summary_lines


def served_batching(config: dict) -> str:
    """How the served model batches, in words, from its config as served."""
    if not config.get("max_batch_size"):
        return f"No batching (the model has no batch axis): each request is {UNBATCHED}"
    batcher = config.get("dynamic_batching")
    if batcher is None:
        return f"As served: max_batch_size {config['max_batch_size']}, no dynamic batcher (each request runs as sent)"
    delay = int(batcher.get("max_queue_delay_microseconds", 0))
    preferred = batcher.get("preferred_batch_size")
    return (
        f"As served: max_batch_size {config['max_batch_size']}, dynamic batching (max queue delay {delay} us"
        + (f", preferred batch sizes {' '.join(map(str, preferred))}" if preferred else "")
        + ")"
    )


def render_served_report(
    *,
    run_id: str,
    request,
    served,
    sweep,
    identity: dict,
    hardware,
    results: pd.DataFrame,
    summary: dict,
    stage_seconds: dict[str, float],
    plots_dir: Path,
    status: str = "completed",
    error: str | None = None,
    measured_shapes: list[str] | None = None,
    guessed_shapes: dict[str, list[int]] | None = None,
    guessed_values: dict[str, str] | None = None,
    source: dict | None = None,
    steps: pd.DataFrame | None = None,
) -> str:
    """`served`: the ServedModel (None when the run stopped before the server answered); `sweep`: its ServedSweep;
    `source`: where the model came from when not a running server's (a user's repository: its `title`, `intro`,
    `server`, `served_by` and a `section` of lines of its own); `steps`: a pipeline's step rows, where it is one."""
    source = source or {}
    title = source.get("title") or f"{request.served_model} on {request.server_url}"
    intro = source.get("intro") or (
        "A model already served, measured where it is: nothing was exported, uploaded, loaded or changed on the server."
    )
    lines = [
        f"# Triton benchmark: {title}",
        "",
        f"Run `{run_id}`, status **{status}**" + (f": {error}" if error else "") + ".",
        "",
        f"{intro} Accuracy is not measured: there is no source model to compare its answers with.",
        "",
        *source.get("section", []),
    ]
    config = served.config_json() if served is not None else {}
    where = source.get("server") or f"at {request.server_url}"
    served_by = source.get("served_by") or (f"{served.kind} backend" if served else "-")
    lines += [
        "## Configuration",
        "",
        _kv_table(
            [
                ("Server", f"{identity.get('id') or 'Triton'} {identity.get('version') or ''} {where}"),
                ("Model", served.name if served else request.served_model),
                ("Version", (served.version or "the server's choice") if served else "-"),
                ("Served by", served_by),
                ("Max Batch Size", config.get("max_batch_size", "-")),
                ("Number of model instances", served.instances if served else "-"),
                ("Batching", served_batching(config) if served else "-"),
                ("Input data", request.input_data or "synthetic"),
                *([("Dynamic dims", "; ".join(measured_shapes))] if measured_shapes else []),
                ("Profile", sweep.profile if sweep else "-"),
            ]
        ),
        "",
        "The model's config as served is in `served_config.json`:",
        "",
        "```json",
        json.dumps(config, indent=1)[:4000],
        "```",
        "",
        "## Client",
        "",
        _kv_table([("CPU", hardware.cpu_model), ("CPU cores", hardware.cpu_cores), ("OS", hardware.os)]),
        "",
        "## Summary",
        "",
        *summary_lines(summary),
    ]
    lines += chosen_lines(guessed_shapes, guessed_values)
    if served is not None:
        lines += format_section(
            served.format,
            source.get("backend") or f"{served.kind} (as served)",
            [],
            None,
            results,
            plots_dir,
            online_batch_size=sweep.online_batch_size if sweep else 1,
            batching=served.batching,
            served_as=served_batching(config),
        )
    lines += pipeline_lines(steps, results, plots_dir)
    lines += closing_lines(results, stage_seconds)
    return "\n".join(lines)
