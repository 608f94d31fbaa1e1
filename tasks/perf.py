"""Stage 5: perf_analyzer sweeps: the Prefect task; the logic is in tbench.stages.sweep."""

from __future__ import annotations

import re

import pandas as pd
from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from tbench.core import progress
from tbench.core.enums import Scenario
from tbench.loadgen.perf_analyzer import Point
from tbench.stages.sweep import run_sweep


@task(name="perf-sweep", task_run_name="perf-{scenario.value}-{model}", cache_policy=NO_CACHE)
def perf_task(scenario: Scenario, points: list[Point], model: str, **kwargs) -> pd.DataFrame:
    """The sweep, with its progress shown as a Prefect progress artifact."""
    key = re.sub(r"[^a-z0-9-]", "-", f"perf-{scenario.value}-{model}".lower())  # artifact keys: lowercase, dashes
    artifact = create_progress_artifact(0.0, key=key, description=f"perf_analyzer {scenario.value} sweep of {model}")

    def on_event(event: str, **data) -> None:
        if event == "point_done":
            update_progress_artifact(artifact, 100.0 * data["index"] / data["total"])

    progress.subscribe(on_event)
    try:
        return run_sweep(points, model=model, **kwargs)
    finally:
        progress.unsubscribe(on_event)
