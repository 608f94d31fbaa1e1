"""The capacity flow: wiring only. Without pools it plans on this machine: the configuration search at open-loop
rates (flows/search.run_search with a CapacityRequest), each candidate judged by its sustainable rate under the SLO,
and the answer (instances, cost) in capacity.md/.html/.json. With pools it runs that on every pool through the pools'
capacity deployments (one child run each, in parallel, as the matrix does), gathers their answers and writes one
report ranking the pools by cost at the SLO; a pool whose run did not finish is a row saying why."""

from __future__ import annotations

import os

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.matrix import settled, store_parent_run
from flows.search import run_search
from flows.served_capacity import served_capacity
from tasks.matrix_runs import matrix_run
from tbench.capacity.report import PoolAnswer, read_answers, write_capacity_files
from tbench.capacity.request import CapacityRequest
from tbench.core.errors import BenchError
from tbench.core.layout import RunLayout, new_run_id
from tbench.node import hardware as hw
from tbench.request.benchmark import BenchmarkRequest
from tbench.stages.store import staging_root
from tbench.stages.tracker import RunTracker
from tbench.team.matrix_runs import children_cancelled_on_interrupt


class CapacityIncomplete(BenchError):
    """Some pools' runs did not finish; the report of the others is stored."""


@flow(name="triton-capacity")
def capacity_flow(request: BenchmarkRequest = BenchmarkRequest(), capacity: CapacityRequest = CapacityRequest()) -> str:
    """Plan the capacity for the traffic under the SLO, here or on every pool named; returns the run folder's URL."""
    if request.served_model:  # a model someone else serves: its configuration is the server's, only the rate is sought
        return served_capacity(request, capacity, hw.detect())
    if not capacity.pools:
        return run_search(request, capacity.search(), capacity=capacity)
    return _across_pools(request, capacity)


def child_parameters(request: BenchmarkRequest, capacity: CapacityRequest, pool: str) -> dict:
    return {
        "request": request.model_dump(mode="json", exclude_unset=True) | {"model": request.model},
        "capacity": capacity.model_dump(mode="json") | {"pools": [], "pool": pool},
    }


def child_answer(row: dict, model: str) -> PoolAnswer:
    """A pool's answer from its stored run folder; a run that did not finish, or left no answer, says why."""
    if row["state"] == "COMPLETED" and row.get("run_url"):
        stored = read_answers(row["run_url"])
        if stored:
            return stored[0].model_copy(update={"pool": row["pool"], "run_url": row["run_url"]})
        reason = "the run completed without a capacity answer"
    else:
        reason = f"{row['state']}: {row.get('reason') or 'the run did not finish'}"
    return PoolAnswer(pool=row["pool"], model=model, status="failed", reason=reason, run_url=row.get("run_url") or "")


def _across_pools(request: BenchmarkRequest, capacity: CapacityRequest) -> str:
    root = request.output or os.environ.get("TBENCH_ARTIFACT_ROOT", "runs")
    layout = RunLayout(staging_root(root), new_run_id(f"{request.model}-capacity-pools")).create()
    tracker = RunTracker(layout)
    with tracker.stage("runs"), children_cancelled_on_interrupt():
        futures = {
            pool: matrix_run.submit(
                pool,
                request.model,
                None,
                str(request.precision),
                child_parameters(request, capacity, pool),
                600,
                capacity.child_timeout_s,
                flow="capacity",
            )
            for pool in capacity.pools
        }
        rows = [settled(future, pool, request.model, None, str(request.precision)) for pool, future in futures.items()]
    with tracker.stage("report"):
        answers = [child_answer(r, request.model) for r in rows]
        text = write_capacity_files(layout.run_dir, answers, capacity, request.model)
        layout.report_md.write_text(text)
        create_markdown_artifact(text, key="capacity-report", description="Capacity plan across the pools")
    unfinished = [a for a in answers if a.status == "failed"]
    url = store_parent_run(
        tracker,
        layout,
        root,
        request=request.model_dump(mode="json"),
        capacity=capacity.model_dump(mode="json"),
        runs=rows,
        not_finished=len(unfinished),
    )
    if unfinished:
        named = ", ".join(f"{a.pool} ({a.reason})" for a in unfinished[:3])
        raise CapacityIncomplete(f"{len(unfinished)} of {len(answers)} pools did not answer: {named}; report: {url}")
    return url
