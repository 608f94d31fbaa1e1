"""Stage: this run against a stored baseline run: the Prefect task; the logic is in tbench.results.baseline."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tbench.results.baseline import compare_with_baseline


@task(name="compare-baseline", cache_policy=NO_CACHE)
def baseline_task(baseline: str, run_dir: Path, plots_dir: Path) -> tuple[list[str], dict]:
    return compare_with_baseline(baseline, run_dir, plots_dir)
