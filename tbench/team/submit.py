"""`tbench submit`: start a deployment run on a pool of a (remote) Prefect server and follow it to the end.

The run is created through the API (the deployment `triton-benchmark/benchmark-<pool>`); a worker of that pool picks it
up. Following it prints its state changes and its log lines as they arrive, and at the end where the report is (the
link artifact the store stage creates) and the final state.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from tbench.core.errors import BenchError

REPORT_LINK_KEY = "benchmark-report-html"  # tasks.store's link artifact
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


class SubmitError(BenchError):
    """The run could not be submitted (no such deployment, server unreachable)."""


@dataclass
class Followed:
    flow_run_id: UUID
    state: str  # the final state's type: COMPLETED, FAILED, CRASHED, CANCELLED (or the last seen on timeout)
    state_name: str
    message: str
    report_url: str | None
    seconds_to_running: float | None  # from the API call to the RUNNING state (pickup + start)


def deployment_name(flow: str, pool: str) -> str:
    return {
        "benchmark": f"triton-benchmark/benchmark-{pool}",
        "search": f"triton-search/search-{pool}",
        "capacity": f"triton-capacity/capacity-{pool}",
        "fleet": f"triton-fleet/fleet-{pool}",
        "colocated": f"triton-colocated/colocated-{pool}",
    }[flow]


def submit(deployment: str, parameters: dict, tags: list[str] | None = None, job_variables: dict | None = None) -> UUID:
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    try:
        run = run_deployment(deployment, parameters=parameters, timeout=0, tags=tags or [], job_variables=job_variables)
    except ObjectNotFound:
        raise SubmitError(
            f"no deployment {deployment!r} on the Prefect server (deploy deployments/prefect.yaml)"
        ) from None
    except Exception as err:  # httpx connection errors and the like
        raise SubmitError(f"cannot submit to the Prefect server: {type(err).__name__}: {err}") from None
    return run.id


def report_link(client, flow_run_id: UUID) -> str | None:
    """The HTML report's URL, from the link artifact the run's store stage made."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    artifacts = client.read_artifacts(
        artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]), key=ArtifactFilterKey(any_=[REPORT_LINK_KEY])
        )
    )
    for artifact in artifacts:
        found = re.search(r"\]\(([^)]+)\)", str(artifact.data or ""))  # the link is stored as markdown: [text](url)
        if found:
            return found.group(1)
    return None


def shown(log) -> bool:
    """The flow's own lines, and warnings or errors from its tasks (not every task's 'Finished in state')."""
    return log.task_run_id is None or log.level >= 30


def follow(
    flow_run_id: UUID,
    on_line: Callable[[str], None],
    timeout_s: float = 3600,
    poll_s: float = 1.0,
    submitted_at: float | None = None,
) -> Followed:
    """Print state changes and logs until the run ends (or `timeout_s`)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    submitted_at = submitted_at or time.monotonic()
    deadline = time.monotonic() + timeout_s
    seen_logs, last_state, to_running = 0, None, None
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            state = run.state.type.value if run.state else "PENDING"
            if run.state and run.state.name != last_state:
                last_state = run.state.name
                on_line(f"state: {last_state}")
                if state == "RUNNING" and to_running is None:
                    to_running = time.monotonic() - submitted_at
            logs = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                sort=LogSort.TIMESTAMP_ASC,
                offset=seen_logs,
                limit=200,
            )
            for log in logs:
                if shown(log):
                    on_line(f"  {log.message}")
            seen_logs += len(logs)
            if state in TERMINAL or time.monotonic() > deadline:
                if state in TERMINAL and not logs:  # the last lines may land just after the final state
                    time.sleep(poll_s)
                    for log in client.read_logs(
                        log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                        sort=LogSort.TIMESTAMP_ASC,
                        offset=seen_logs,
                        limit=200,
                    ):
                        if shown(log):
                            on_line(f"  {log.message}")
                return Followed(
                    flow_run_id,
                    state,
                    run.state.name if run.state else "",
                    (run.state.message or "") if run.state else "",
                    report_link(client, flow_run_id),
                    to_running,
                )
            time.sleep(poll_s)
