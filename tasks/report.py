"""Stage 8: the report: the Prefect tasks; the logic is in tbench.results.report (and served_report, for a model
someone else serves)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from tbench.results.html_report import write_html_report
from tbench.results.report import render_report
from tbench.results.served_report import render_served_report

RESULTS_TABLE_KEY = "benchmark-results"  # the results table on the flow run's page, for whoever reads it back


@task(name="report", cache_policy=NO_CACHE)
def report_task(report_path: Path, results: pd.DataFrame, **kwargs) -> Path:
    return _write(report_path, render_report(results=results, **kwargs), results)


@task(name="report", cache_policy=NO_CACHE)
def served_report_task(report_path: Path, results: pd.DataFrame, **kwargs) -> Path:
    return _write(report_path, render_served_report(results=results, **kwargs), results)


def _write(report_path: Path, text: str, results: pd.DataFrame) -> Path:
    report_path.write_text(text)
    write_html_report(report_path)  # report.html beside it: the same report as one self-contained page
    create_markdown_artifact(text, key="benchmark-report", description="Benchmark report (plots are in the run folder)")
    if not results.empty:
        create_table_artifact(
            results.astype(object).where(results.notna(), "").to_dict(orient="records"),
            key=RESULTS_TABLE_KEY,
            description="Tidy perf_analyzer results",
        )
    return report_path
