"""The configuration search on a Triton server: the Prefect task; the logic is in tbench.search.evaluate."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from tbench.core import progress
from tbench.search.evaluate import artifact_key
from tbench.search.strategies import (
    STRATEGIES,
    Candidate,
    Checkpoint,
    Objective,
    Observation,
    SearchResult,
    SearchSpace,
)


@task(name="search", task_run_name="search-{strategy}", cache_policy=NO_CACHE)
def search_task(
    strategy: str,
    space: SearchSpace,
    objective: Objective,
    evaluator,
    checkpoint: Checkpoint,
    budget_fraction: float = 0.10,
    start: Candidate | None = None,
    label: str = "",
    confirm_rounds: int | None = None,
) -> SearchResult:
    """Run one search strategy; a Prefect progress artifact follows every measured candidate."""
    search = STRATEGIES.get(strategy)  # an unknown name fails before the progress artifact
    artifact = create_progress_artifact(
        0.0,
        key=artifact_key(f"search-{label}"),
        description=f"{strategy} configuration search of {label or 'the model'}",
    )

    def on_observation(obs: Observation, measured: int, limit: int) -> None:
        # `limit`: what the strategy plans to measure (the whole grid for exhaustive, its budget for smart); a
        # confirmation's re-measurement (obs.confirm_round > 0) leaves `measured` as it was
        update_progress_artifact(artifact, 100.0 * measured / limit)
        progress.emit(
            "search_point",
            key=obs.candidate.key,
            status=obs.status,
            error=obs.error,
            throughput=obs.throughput,
            p99_ms=obs.p99_ms,
            measured=measured,
            limit=limit,
            confirm_round=obs.confirm_round,
        )

    result = search(
        space,
        objective,
        evaluator,
        checkpoint,
        budget_fraction=budget_fraction,
        start=start,
        on_observation=on_observation,
        **({"confirm_rounds": confirm_rounds} if confirm_rounds is not None else {}),
    )
    update_progress_artifact(artifact, 100.0)
    return result
