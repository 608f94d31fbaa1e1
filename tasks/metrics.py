"""Stage 7a: the summary numbers of the tidy table: the Prefect task; the logic is in tbench.results.summary."""

from __future__ import annotations

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from tbench.results.summary import summarize


@task(name="metrics", cache_policy=NO_CACHE)
def metrics_task(results: pd.DataFrame) -> dict:
    return summarize(results)
