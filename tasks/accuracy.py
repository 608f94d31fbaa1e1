"""Stage: accuracy on the served model: the Prefect task; the logic is in tbench.stages.accuracy."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tbench.core.artifacts import AccuracyResult
from tbench.core.enums import Format
from tbench.stages.accuracy import measure_accuracy


@task(name="accuracy", task_run_name="accuracy-{model_name}", cache_policy=NO_CACHE)
def accuracy_task(
    adapter,
    module,
    grpc_url: str,
    model_name: str,
    samples: int,
    batch_size: int,
    atol: float,
    rtol: float,
    fmt: Format,
) -> AccuracyResult:
    return measure_accuracy(adapter, module, grpc_url, model_name, samples, batch_size, atol, rtol, fmt)
