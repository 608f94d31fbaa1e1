"""Stored runs: `tbench compare` (two runs, point by point) and `tbench results` (the results dataset)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import typer
from rich.console import Console

from tbench.cli.common import EXIT_FAILED, cli_errors, console
from tbench.core.errors import StorageError


def compare(
    baseline: str = typer.Argument(
        ...,
        help="The baseline run folder (a path or an fsspec URL), or several joined by commas, each a trial (an A/B "
        "session's runs, `tbench run --against`, are paired by round).",
    ),
    candidate: str = typer.Argument(..., help="The run (or runs, joined by commas) to judge against it."),
    min_effect: float = typer.Option(0.05, min=0, help="Smallest relative change that can count, e.g. 0.05 for 5%."),
    min_effect_p99: float = typer.Option(
        None,
        "--min-effect-p99",
        min=0,
        help="The p99's own smallest change that can count (e.g. 0.15): a tail moves from run to run far more than a "
        "mean, so resolving --min-effect on it can take more trials than a run affords. Default: --min-effect.",
    ),
    k: float = typer.Option(3.0, "-k", help="How many times the combined window noise a change must exceed."),
    run_cv: float = typer.Option(
        None,
        "--run-cv",
        min=0,
        help="The machine's run-to-run spread of a point (e.g. 0.05), stated, for runs measured with one trial each; "
        "runs with --trials measure their own. Without either, no change can be put on the model (exit 2).",
    ),
    run_cv_p99: float = typer.Option(
        None,
        "--run-cv-p99",
        min=0,
        help="The same for the p99, whose tail moves from run to run far more than a mean; without it (or trials) "
        "a p99 is not judged by --run-cv.",
    ),
    output: str = typer.Option(".", "--output", "-o", help="Folder for comparison.md and comparison.png."),
) -> None:
    """Per-point deltas and a verdict judged by the run-to-run spread; exit 0 (no change or faster), 1 (regression),
    2 (not comparable, or undetermined: the data cannot resolve the change)."""
    from tbench.results.compare import compare_runs, comparison_markdown, plot_comparison, verdict_exit_code

    with cli_errors(2, also=(OSError, ValueError)):  # 2: not comparable (a run that is missing or unreadable)
        result = compare_runs(
            baseline, candidate, min_effect, k, run_cv=run_cv, run_cv_p99=run_cv_p99, min_effect_p99=min_effect_p99
        )
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(comparison_markdown(result))
    plot_comparison(result, out / "comparison.png")
    typer.echo(result.summary)
    raise typer.Exit(verdict_exit_code(result))


def results(
    root: str = typer.Option(
        None,
        "--root",
        help="The artifact root holding the results dataset (default: $TBENCH_ARTIFACT_ROOT, else ./runs).",
    ),
    model: str = typer.Option(None, help="Only this model."),
    gpu: str = typer.Option(
        None, help="Only this GPU (as the results name it, e.g. 'CPU' or 'NVIDIA A100-SXM4-80GB')."
    ),
    since: str = typer.Option(None, help="Only runs from this date on (YYYY-MM-DD)."),
    all_points: bool = typer.Option(False, "--all", help="Every point, not the best per run, format and scenario."),
    csv: str = typer.Option(None, "--csv", help="Also write the rows to this CSV file."),
    include_incomplete: bool = typer.Option(
        False,
        "--include-incomplete",
        help="Also runs that failed or were interrupted (by default: completed runs, with or without failed points).",
    ),
) -> None:
    """Query the results of every stored run (the partitioned Parquet dataset under the artifact root)."""
    from rich.table import Table

    from tbench.core.storage import error_cause, store_errors
    from tbench.results.dataset import best_per_run, query_results

    root = existing_root(root or os.environ.get("TBENCH_ARTIFACT_ROOT", "runs"))
    if since:
        with cli_errors(EXIT_FAILED, "cannot read --since (YYYY-MM-DD): ", also=(ValueError,)):
            dt.date.fromisoformat(since)  # a ValueError names what it could not read
    # store_errors: an S3 endpoint that is down raises botocore's own errors, not OSErrors
    with cli_errors(
        EXIT_FAILED, f"cannot read the results dataset under {root}: ", also=store_errors(), describe=error_cause
    ):
        table = query_results(root, model=model, gpu=gpu, since=since, include_incomplete=include_incomplete)
    if table.empty:
        console.print(
            f"no stored results under {root}/results match"
            + ("" if include_incomplete else " (failed and interrupted runs are left out: --include-incomplete)")
        )
        raise typer.Exit(0)
    rows = table if all_points else best_per_run(table)
    if csv:
        rows.to_csv(csv, index=False)
    headers = {
        "date": "date",
        "run_id": "run",
        "model": "model",
        "gpu": "gpu",
        "format": "format",
        "precision": "precision",
        "scenario": "scenario",
        "batch_size": "batch",
        "concurrency": "conc.",
        "throughput_infer_per_s": "infer/s",
        "p99_ms": "p99 ms",
        "run_status": "run status",
    }
    shown = [c for c in headers if c in rows.columns]
    out = Table(*(headers[c] for c in shown), title=f"{len(rows)} rows from {table['run_id'].nunique()} runs")
    for _, r in rows[shown].iterrows():
        out.add_row(*("" if pd_missing(v) else (f"{v:.2f}" if isinstance(v, float) else str(v)) for v in r))
    Console(width=None if console.is_terminal else 200).print(out)


def existing_root(root: str) -> str:
    """A local artifact root that is not there is a typo far more often than a store not yet written: refused in one
    line (a remote root is read as it is: the first upload makes it)."""
    from tbench.core.storage import is_remote

    if not is_remote(root) and not Path(root.removeprefix("file://")).expanduser().is_dir():
        console.print(f"[red]error:[/] no artifact root at {root}: runs are kept there by `tbench run -o {root}`")
        raise typer.Exit(EXIT_FAILED)
    return root


def pd_missing(value) -> bool:
    import pandas as pd

    return value is None or (not isinstance(value, str) and bool(pd.isna(value)))


def history(
    root: str = typer.Argument(
        None, help="The artifact root holding the results dataset (default: $TBENCH_ARTIFACT_ROOT, else ./runs)."
    ),
    output: str = typer.Option(
        None, "--output", "-o", help="Where the site goes: a folder or an fsspec URL (default: ROOT/history)."
    ),
    model: str = typer.Option(None, help="Only this model's series."),
    gpu: str = typer.Option(None, help="Only this GPU's series (as the results name it, e.g. 'CPU')."),
    min_effect: float = typer.Option(
        0.05, min=0, help="Smallest relative step that counts as a change, e.g. 0.05 for 5%."
    ),
) -> None:
    """Every series of the stored runs judged for step changes, each change put down to what differed in the runs'
    manifests, and a static site of it all; exit 0 (no regression), 1 (a series' newest run confirmed a regression:
    once per change, on the run that confirms it), 2 (undetermined: no series has enough runs to confirm a change)."""
    from tbench.core.storage import error_cause, store_errors
    from tbench.history.analysis import EXIT_CODES, analyse
    from tbench.history.site import default_target, publish_site

    root = existing_root(root or os.environ.get("TBENCH_ARTIFACT_ROOT", "runs"))
    with cli_errors(EXIT_FAILED):
        try:
            judged = analyse(root, model=model, gpu=gpu, min_effect=min_effect)
            index = publish_site(judged, output or default_target(root))
        except store_errors() as err:
            raise StorageError(f"cannot read or write the history of {root}: {error_cause(err)}") from None
    for finding in judged.findings:
        if finding.new or finding.candidate:  # what the newest runs said; older changes are on the site
            console.print(finding.line(), markup=False, highlight=False)
    typer.echo(f"{judged.summary()}; site: {index}")
    raise typer.Exit(EXIT_CODES[judged.verdict])
