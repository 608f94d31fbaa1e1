"""Scheduled sweeps that watch themselves, on the local stack for real: the cpu pool's nightly deployment runs on a
5 s schedule instead of at 02:00, each run is stored in S3 and judged against its history by the flow's history
stage, and a change planted in the schedule's parameters half-way (the dynamic batcher's queue delay raised from
2 ms to 8 ms, as a config change that slipped into a nightly would) is found at the run it started, put down to what
differed, and posted to the team's webhook by the automation.

Everything is the product's: the deployment and its schedule from deployments/prefect.yaml, the process worker, the
embedded tritonserver and perf_analyzer, moto's S3 over HTTP, the automation and webhook block of
tbench.history.alerts. The test only shortens the schedule, as a user would in the UI, and makes an overrunning night
skip (CANCEL_NEW) rather than overlap the next one; the Prefect server's scheduler looks every 2 s instead of 60 s
and keeps 3 runs ahead."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import running_stack
from prefect.exceptions import ObjectNotFound
from services import webhook_receiver

pytestmark = pytest.mark.e2e

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tiny_model import build_tiny_image_onnx  # noqa: E402 - a fast model we did not write

from tasks.history import HISTORY_LINK_KEY  # noqa: E402
from tasks.report import RESULTS_TABLE_KEY  # noqa: E402
from tbench.core.metrics import OK  # noqa: E402
from tbench.history.analysis import EXIT_CODES, NO_REGRESSION, REGRESSION, UNDETERMINED  # noqa: E402

TBENCH = str(Path(sys.executable).with_name("tbench"))
DEPLOYMENT = "triton-benchmark/benchmark-cpu"
BEFORE, PLANTED = 2000, 8000  # queue delay (us) of the nights before the change and from it on
NIGHTS_BEFORE, NIGHTS_AFTER = 4, 3  # the detector confirms a step with 3 runs after it (tbench.history.detect)


@pytest.fixture(scope="module")
def receiver():
    with webhook_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def stack(tmp_path_factory, receiver):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS", "2")
        env.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS", "3")  # 100 by default: 500 s of 5 s nights
        # the worker takes a night when it is due, not 10 s before: one taken early waits for its time while holding
        # the deployment's one slot, so the night after it skips two more slots (a 25 s cadence for 13 s nights)
        env.setenv("PREFECT_WORKER_PREFETCH_SECONDS", "0")
        yield from running_stack(tmp_path_factory.mktemp("stack"), pools=("cpu",), alert_webhook=receiver.url)


def nightly_parameters(model: Path, queue_delay_us: int) -> dict:
    """The nightly's request, made small: one online point whose latency the queue delay dominates."""
    return {
        "request": {
            "model_file": str(model),
            "scenarios": ["online"],
            "concurrency": [1],
            "max_queue_delay_us": queue_delay_us,
            "measurement": {"window_s": 0.5},
        }
    }


def runs_in(client, deployment_id, *state_types: str) -> list:
    """The deployment's runs in these states (COMPLETED, RUNNING ...)."""
    from prefect.client.schemas import filters

    return client.read_flow_runs(
        deployment_filter=filters.DeploymentFilter(id=filters.DeploymentFilterId(any_=[deployment_id])),
        flow_run_filter=filters.FlowRunFilter(
            state=filters.FlowRunFilterState(type=filters.FlowRunFilterStateType(any_=list(state_types)))
        ),
    )


def measured(client, runs: list) -> list:
    """The runs whose results table (the report stage's artifact) has an ok point: a series holds ok points only
    (tbench.history.series.build_series), so a night whose one point ended unstable on a busy machine (seen with the
    suite's three workers) is a night without a figure, and another is waited for."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    if not runs:
        return []
    tables = client.read_artifacts(
        artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[RESULTS_TABLE_KEY]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[r.id for r in runs]),
        )
    )
    with_ok = {a.flow_run_id for a in tables if any(row.get("status") == OK for row in json.loads(a.data))}
    return [r for r in runs if r.id in with_ok]


def wait_for_nights(client, deployment_id, queue_delay_us: int, count: int, timeout_s: float) -> list:
    """The completed scheduled runs with an ok point, in the order they started, once `count` of them asked for this
    queue delay."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        completed = runs_in(client, deployment_id, "COMPLETED")
        nights = measured(client, sorted((r for r in completed if r.auto_scheduled), key=lambda r: r.start_time))
        if sum(r.parameters["request"]["max_queue_delay_us"] == queue_delay_us for r in nights) >= count:
            return nights
        time.sleep(2)
    states = [r.state.name for r in client.read_flow_runs(limit=20)]
    raise AssertionError(f"{count} nights at {queue_delay_us} us did not complete in {timeout_s:.0f} s: {states}")


def retire_old_nights(client, deployment_id, queue_delay_us: int, settle_s: float = 20) -> int:
    """Delete the scheduled nights that still carry the old request. Prefect deletes a schedule's future runs when its
    parameters change, but a scheduler pass that read the schedule before the change can insert them again after it
    (seen on a loaded machine: every night kept the old request for 10 minutes); a pass that starts later reads the
    new one. Returns how many it deleted."""
    deleted, deadline = 0, time.monotonic() + settle_s
    while time.monotonic() < deadline:
        deleted += delete_scheduled(client, deployment_id, queue_delay_us)
        time.sleep(2)
    return deleted


def delete_scheduled(client, deployment_id, queue_delay_us: int | None = None) -> int:
    """Delete the deployment's runs that are scheduled and not yet started (those asking for this queue delay, or all);
    how many it deleted. One gone meanwhile (Prefect deletes a schedule's future runs when it changes) is skipped."""
    deleted = 0
    for run in runs_in(client, deployment_id, "SCHEDULED"):
        if queue_delay_us is None or run.parameters["request"]["max_queue_delay_us"] == queue_delay_us:
            with contextlib.suppress(ObjectNotFound):
                client.delete_flow_run(run.id)
                deleted += 1
    return deleted


def wait_until_idle(client, deployment_id, timeout_s: float = 300) -> None:
    """No run of the deployment is on its way, nor will be, once its schedule is off: the nights it scheduled and did
    not start are deleted (a late one would still be taken by the worker: seen with one core kept busy, a night stored
    between the history's two readings below), and those started finish."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        delete_scheduled(client, deployment_id)
        if not runs_in(client, deployment_id, "SCHEDULED", "PENDING", "RUNNING"):
            return
        time.sleep(2)
    raise AssertionError(f"the deployment's runs did not finish within {timeout_s:.0f} s of its schedule's end")


JUDGE = """
import json, sys
from tbench.history.analysis import analyse
from tbench.history.series import load_points
root = sys.argv[1]
history = analyse(root, model="tiny")
points, manifests = load_points(root, model="tiny")
runs = points.sort_values("started_at")["run_id"].unique()
delay = {run: manifests[run]["request"]["max_queue_delay_us"] for run in runs}
print(json.dumps({
    "runs": list(delay), "delay": delay,
    "findings": [{"series": f.series.name, "after": f.run_after, "before": f.run_before, "candidate": f.candidate,
                  "regression": f.regression, "relative": f.change.relative, "new": f.new,
                  "differences": [{"line": d.line(), "at_change": d.at_change} for d in f.differences]}
                 for f in history.findings],
}))
"""


def in_stack(stack, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, env={**os.environ, **stack.client_env()}, capture_output=True, text=True, timeout=timeout
    )


def test_a_change_planted_in_the_nightly_is_found_at_its_run_attributed_and_posted(stack, receiver, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy, ConcurrencyOptions
    from prefect.client.schemas.schedules import IntervalSchedule
    from prefect.settings import PREFECT_API_URL, temporary_settings

    model = build_tiny_image_onnx(tmp_path / "tiny.onnx")
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(DEPLOYMENT)
        (nightly,) = deployment.schedules  # deployments/prefect.yaml's nightly, inactive as shipped
        assert not nightly.active
        client.update_deployment(
            deployment.id,
            DeploymentUpdate(
                concurrency_limit=1,
                concurrency_options=ConcurrencyOptions(collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW),
            ),
        )
        every_5_s = IntervalSchedule(interval=dt.timedelta(seconds=5))
        try:
            client.update_deployment_schedule(
                deployment.id,
                nightly.id,
                active=True,
                schedule=every_5_s,
                parameters=nightly_parameters(model, BEFORE),
            )
            wait_for_nights(client, deployment.id, BEFORE, NIGHTS_BEFORE, timeout_s=600)
            # the planted change: the schedule's request now asks for a longer queue delay
            client.update_deployment_schedule(deployment.id, nightly.id, parameters=nightly_parameters(model, PLANTED))
            retire_old_nights(client, deployment.id, BEFORE)
            nights = wait_for_nights(client, deployment.id, PLANTED, NIGHTS_AFTER, timeout_s=600)
        finally:
            client.update_deployment_schedule(deployment.id, nightly.id, active=False)
            wait_until_idle(client, deployment.id)
        # every night linked its history site on its page
        last = nights[-1]
        links = [a for a in client.read_artifacts() if a.key == HISTORY_LINK_KEY and a.flow_run_id == last.id]
    assert links and f"{stack.artifact_root}/history/index.html" in links[0].data, links

    judged = in_stack(stack, [sys.executable, "-c", JUDGE, stack.artifact_root])
    assert judged.returncode == 0, judged.stderr[-3000:]
    history = json.loads(judged.stdout)
    delays = [history["delay"][run] for run in history["runs"]]
    first_planted = history["runs"][delays.index(PLANTED)]
    assert delays.count(BEFORE) >= NIGHTS_BEFORE and delays.count(PLANTED) >= NIGHTS_AFTER
    assert delays == sorted(delays), "a night ran with the old request after the change"

    confirmed = [f for f in history["findings"] if not f["candidate"]]
    moved = {f["series"].rsplit(" · ", 1)[1] for f in confirmed}
    # both move by 3x; one of them may wait a night more for its confirmation, when one of the three nights after the
    # change is an outlier of its segment (a change needs 3 runs on each side that are not: tbench.history.detect)
    assert moved & {"throughput", "p50 latency"}, history["findings"]
    last_before = history["runs"][delays.index(PLANTED) - 1]
    for finding in confirmed:  # found at the run it started, nowhere else, and put down to the queue delay
        if finding["series"].endswith("p99 latency") and finding["after"] == last_before and finding["regression"]:
            # the tail of one point at concurrency 1: on a busy machine the last night before the change can be slow
            # enough to join the segment after it, and the rise is placed a night early (seen once in a full suite)
            continue
        assert finding["after"] == first_planted and finding["regression"], finding
        assert {"line": f"queue delay (us): {BEFORE} → {PLANTED}", "at_change": True} in finding["differences"]

    # the CLI's verdict for a CI job, from another process with the stack's environment only: a regression once, on
    # the night that confirmed it. That is the newest night, unless one more night ran before the schedule was turned
    # off (a busy machine's nights run long): then the change is no longer news, and the gate fired on its night
    cli = in_stack(stack, [TBENCH, "history", stack.artifact_root, "--model", "tiny", "--output", str(tmp_path / "s")])
    printed = cli.stdout + cli.stderr
    if ": lost, " in printed:  # the newest night lost its point (unstable on a busy machine): never a pass, it says so
        lost_status = printed.split(": lost, ", 1)[1].split(" ", 1)[0]
        expected = (
            REGRESSION if lost_status in ("behind", "error") or any(f["new"] for f in confirmed) else UNDETERMINED
        )
        assert cli.returncode == EXIT_CODES[expected] and f"{expected}: 3 series over" in printed, printed
    elif any(f["new"] for f in confirmed):
        assert cli.returncode == EXIT_CODES[REGRESSION] and f"{REGRESSION}: 3 series over" in printed, printed
        assert f"from run {first_planted} on" in printed and f"queue delay (us): {BEFORE} → {PLANTED}" in printed
    else:
        assert delays.count(PLANTED) > NIGHTS_AFTER, history  # a change is confirmed on its 3rd night at the earliest
        assert cli.returncode == EXIT_CODES[NO_REGRESSION] and f"{NO_REGRESSION}: 3 series over" in printed, printed

    # the night that confirmed the change told the team, through the automation and its webhook
    received = receiver.wait(60)
    assert received, "no regression reached the webhook within 60 s"
    for message in received:
        run = message["subject"].removeprefix("tbench: tiny regressed in run ")
        assert history["delay"][run] == PLANTED, message
        assert f"queue delay (us): {BEFORE} → {PLANTED}" in message["text"]
        assert f"{stack.artifact_root}/history/index.html" in message["text"]
