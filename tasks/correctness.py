"""Stage 2: each converted format against the source model; the Prefect task (logic: tbench.stages.correctness)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tbench.core.artifacts import CorrectnessResult
from tbench.stages.correctness import check_artifacts


@task(name="correctness", cache_policy=NO_CACHE)
def correctness_task(adapter, module, artifacts, atol: float, rtol: float) -> list[CorrectnessResult]:
    return check_artifacts(adapter, module, artifacts, atol, rtol)
