"""Stage 8: the report: the Prefect task; the logic is in tbench.results.report."""

from __future__ import annotations

from pathlib import Path

import pandas as pd  # noqa: E402
from prefect import task  # noqa: E402
from prefect.artifacts import create_markdown_artifact, create_table_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from tbench.results.html_report import write_html_report
from tbench.results.report import (
    render_report,
)


@task(name="report", cache_policy=NO_CACHE)
def report_task(report_path: Path, results: pd.DataFrame, **kwargs) -> Path:
    text = render_report(results=results, **kwargs)
    report_path.write_text(text)
    write_html_report(report_path)  # report.html beside it: the same report as one self-contained page
    create_markdown_artifact(text, key="benchmark-report", description="Benchmark report (plots are in the run folder)")
    if not results.empty:
        create_table_artifact(
            results.astype(object).where(results.notna(), "").to_dict(orient="records"),
            key="benchmark-results",
            description="Tidy perf_analyzer results",
        )
    return report_path
