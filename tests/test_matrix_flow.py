"""The matrix flow against a real Prefect server (the test harness's): children that no worker runs are cancelled
within their limits, the flow ends, and the report of the matrix is still written, listing them and why."""

from __future__ import annotations

import json
import time


def test_children_nobody_runs_are_cancelled_and_reported(prefect_harness, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.states import Pending

    from flows.matrix import MatrixRequest, matrix_flow
    from tbench.team.pool_setup import create_pools

    create_pools(pool_type="process", names=["a100", "t4"])
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("triton-benchmark")
        for pool in ("a100", "t4"):
            client.create_deployment(
                flow_id=flow_id,
                name=f"benchmark-{pool}",
                work_pool_name=pool,
                entrypoint="flows/benchmark.py:benchmark_flow",
            )
        # the t4 pool has a live worker (it heartbeats) that never takes the run, as if busy: its child is queued,
        # not unattended, so only the child limit stops it; the a100 pool has no worker at all
        client.send_worker_heartbeat("t4", "busy-worker", heartbeat_interval_seconds=120)
        assert (
            client.read_work_pool("t4").status.value == "READY"
            and client.read_work_pool("a100").status.value == "NOT_READY"
        )

    matrix = MatrixRequest(
        pools=["a100", "t4"],
        formats=["onnx"],
        request={"size": "small"},
        output=str(tmp_path),
        start_timeout_s=2,
        child_timeout_s=10,
    )
    started = time.monotonic()
    state = matrix_flow(matrix, return_state=True)
    took = time.monotonic() - started

    assert state.is_failed() and "2 of 2 child runs did not finish" in state.message, state.message
    assert 10 <= took < 60, took  # the child limit (10 s) passed, and nothing waited for a worker beyond it
    run_dir = next(tmp_path.glob("matrix-*"))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["not_finished"] == 2 and manifest["status"] == "completed"  # the matrix's own stages all ran
    runs = {r["pool"]: r for r in manifest["runs"]}
    assert runs["a100"]["state"] == runs["t4"]["state"] == "CANCELLED"
    assert (
        runs["a100"]["reason"] == "no worker picked it up within 2 s (state SCHEDULED, pool a100 NOT_READY); cancelled"
    )
    assert runs["t4"]["reason"] == "did not finish within 10 s (state SCHEDULED); cancelled"
    report = (run_dir / "report.md").read_text()
    section = report.split("## Runs that did not finish", 1)[1]
    for pool in ("a100", "t4"):
        assert runs[pool]["flow_run"] in section and runs[pool]["reason"] in section
    assert (run_dir / "report.html").exists()

    with get_client(sync_client=True) as client:
        for pool in ("a100", "t4"):
            child = client.read_flow_run(runs[pool]["flow_run"])
            assert child.state.type.value == "CANCELLED"
            # a worker that comes later proposes Pending before it starts anything: the server refuses it
            assert client.set_flow_run_state(child.id, Pending()).status.value == "ABORT"


def test_an_interrupted_fan_out_cancels_the_children_it_was_watching(prefect_harness):
    """Ctrl-C (or a cancelled parent) while a child runs on another pool: the child is cancelled, not left running
    with nobody waiting for its answer."""
    import threading

    import pytest
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    from tbench.team import matrix_runs
    from tbench.team.pool_setup import create_pools

    create_pools(pool_type="process", names=["a100"])
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("colocated")
        client.create_deployment(
            flow_id=flow_id, name="colocated-a100", work_pool_name="a100", entrypoint="flows/colocated.py:colocated"
        )
    child = run_deployment("colocated/colocated-a100", parameters={}, timeout=0)
    answer = {}

    def follow() -> None:  # as matrix_run follows its child, in a task's thread
        with get_client(sync_client=True) as client:
            answer["run"], answer["reason"] = matrix_runs.watch(client, child.id, "a100", 600, 600, poll_s=0.2)

    watching = threading.Thread(target=follow, daemon=True)
    watching.start()
    deadline = time.monotonic() + 30
    while child.id not in matrix_runs._in_flight and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(KeyboardInterrupt), matrix_runs.children_cancelled_on_interrupt():
        raise KeyboardInterrupt
    watching.join(timeout=30)
    assert answer["run"].state.type.value == "CANCELLED", answer
    assert child.id not in matrix_runs._in_flight
