"""One run of the matrix, submitted to a pool and followed; the Prefect task (logic: tbench.team.matrix_runs)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tbench.core.errors import one_line
from tbench.team.matrix_runs import ChildRun, state_of, watch
from tbench.team.submit import deployment_name, report_link


@task(name="matrix-run", task_run_name="{pool}-{model}-{fmt}-{precision}", cache_policy=NO_CACHE)
def matrix_run(
    pool: str,
    model: str,
    fmt: str | None,
    precision: str,
    parameters: dict,
    start_timeout_s: float,
    child_timeout_s: float,
    flow: str = "benchmark",
) -> dict:
    """One run of `flow` through the pool's deployment, watched to its end; its ChildRun row (never raises)."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    row = ChildRun(pool=pool, model=model, format=fmt or "(default)", precision=precision, state="NOT_SUBMITTED")
    deployment = deployment_name(flow, pool)
    try:
        run = run_deployment(
            deployment, parameters=parameters, timeout=0, tags=["matrix" if flow == "benchmark" else flow]
        )
    except ObjectNotFound:
        return row.model_copy(update={"reason": f"no deployment {deployment!r} on the Prefect server"}).model_dump()
    except Exception as err:  # the server refused the parameters, or could not be reached
        return row.model_copy(
            update={"reason": one_line(f"could not submit: {type(err).__name__}: {err}")}
        ).model_dump()
    row.flow_run, row.state = str(run.id), state_of(run)
    try:
        with get_client(sync_client=True) as client:
            run, row.reason = watch(client, run.id, run.work_pool_name or pool, start_timeout_s, child_timeout_s)
            row.state = state_of(run)
            link = report_link(client, run.id)
    except Exception as err:  # lost the server while following: the child's fate is unknown, say so
        row.reason = one_line(f"lost track of the run: {type(err).__name__}: {err}")
        return row.model_dump()
    row.run_url = link.rsplit("/", 1)[0] if link else None
    return row.model_dump()
