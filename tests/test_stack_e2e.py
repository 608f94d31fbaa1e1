"""The local stack for real: a Prefect server, the pools and deployments, a process worker for the cpu pool and moto's
S3 server over HTTP. Runs are submitted through the API (`tbench submit`, a subprocess), picked up by the worker,
executed on the embedded tritonserver with the real perf_analyzer, and their artifacts and results read back from the
S3 endpoint by other processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import pytest
from conftest import measured

from tbench.team.stack import Stack

pytestmark = pytest.mark.e2e

TBENCH = str(Path(sys.executable).with_name("tbench"))
SMALL_RUN = [
    "resnet50",
    "--size",
    "small",
    "--formats",
    "onnx",
    "--batch-sizes",
    "1,4",
    "--concurrency",
    "2",
    "--window-s",
    "0.5",
    "--stability",
    "50",  # plumbing, not numbers: the other test worker keeps this machine busy
]


def in_stack(stack: Stack, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, env={**os.environ, **stack.client_env()}, capture_output=True, text=True, timeout=timeout
    )


READ_BACK = """
import json, sys, fsspec, pandas as pd
root = sys.argv[1]
fs, path = fsspec.core.url_to_fs(root)
manifest = json.loads(fs.cat_file(path + "/manifest.json"))
with fs.open(path + "/results.parquet", "rb") as f:
    results = pd.read_parquet(f)
present = {p[len(path) + 1:]: fs.size(p) for p in fs.find(path)}
print(json.dumps({"manifest": manifest, "points": len(results), "ok": int((results["status"] == "ok").sum()),
                  "rows": json.loads(results.to_json(orient="records")), "present": present,
                  "html": fs.cat_file(path + "/report.html")[:200].decode(errors="replace")}))
"""


@pytest.fixture(scope="module", autouse=True)
def never_started(stack) -> UUID:
    """A run a worker took (Pending) and never started, as when the worker dies or the API fails while it starts it;
    on a pool without a worker, nothing else touches it. Made as the module's first test begins, so that the stack's
    never-started limit (120 s) has passed by the time the killed-worker test looks at it: not waited for there."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Pending

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("triton-benchmark/benchmark-a100")
        return client.create_flow_run_from_deployment(deployment.id, state=Pending()).id


def read_back(stack: Stack, run_url: str) -> dict:
    """Another process, with nothing but the stack's environment, reads the stored run from S3."""
    done = in_stack(stack, [sys.executable, "-c", READ_BACK, run_url], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_submitted_run_is_picked_up_and_its_artifacts_read_back_from_s3(stack):
    done = in_stack(stack, [TBENCH, "submit", *SMALL_RUN, "--pool", "cpu"])
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    output = done.stdout + done.stderr
    assert "state: Running" in output and "state: Completed" in output
    report = next(line.split("report:", 1)[1].strip() for line in output.splitlines() if "report:" in line)
    assert report.startswith("s3://tbench/runs/resnet50-") and report.endswith("/report.html")
    stored = read_back(stack, report.rsplit("/", 1)[0])
    manifest = stored["manifest"]
    assert manifest["status"] == "completed" and stored["points"] == stored["ok"] == 3
    # every file the manifest lists is in the bucket with its size, and nothing half-written is left behind
    assert {e["path"]: e["bytes"] for e in manifest["files"]}.items() <= stored["present"].items()
    assert not [p for p in stored["present"] if ".tmp-" in p]
    assert "<html" in stored["html"].lower()
    assert manifest["hardware"]["hostname"] and manifest["request"]["model"] == "resnet50"
    assert not (stack.root / "staging" / manifest["run_id"]).exists()  # stored: the worker's disk keeps no copy
    # the results dataset across runs, queried by yet another process
    results = in_stack(stack, [TBENCH, "results", "--model", "resnet50"])
    assert results.returncode == 0 and manifest["run_id"] in results.stdout, results.stdout + results.stderr


def test_a_model_file_from_a_laptop_is_handed_to_the_pool_and_benchmarked(stack, tmp_path):
    """`tbench submit --model-file`: the file and its external data go to S3 under their digest; the worker (another
    process, its own cache) fetches, checks and benchmarks them."""
    from test_handover import external_data_onnx

    model = external_data_onnx(tmp_path / "laptop")
    quick = ["--scenarios", "offline", "--batch-sizes", "2", "--window-s", "0.5", "--stability", "50"]  # one point
    done = in_stack(stack, [TBENCH, "submit", "--model-file", str(model), *quick, "--pool", "cpu"])
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "state: Completed" in output, output[-3000:]
    uploaded = next(line.split(": ", 1)[1] for line in output.splitlines() if line.startswith("model file: "))
    assert uploaded.startswith("s3://tbench/runs/inputs/") and uploaded.endswith("/mlp.onnx")
    report = next(line.split("report:", 1)[1].strip() for line in output.splitlines() if "report:" in line)
    stored = read_back(stack, report.rsplit("/", 1)[0])
    assert stored["manifest"]["request"]["model_file"] == uploaded and stored["points"] == stored["ok"] == 1
    assert any(p.endswith("models/onnx/weights.bin") for p in stored["present"])  # the weights travelled on


EMIT = """
import sys
from prefect.events.worker import EventsWorker
from tasks.history import emit_regressed
emit_regressed("tiny", "tiny-run-1", "s3://tbench/runs/history/index.html", [sys.argv[1]])
EventsWorker.drain_all()
"""


def test_a_regression_event_reaches_the_teams_webhook_through_the_automation(stack):
    """tbench.history.alerts on the stack's server (a webhook block and an automation), the event the history stage
    emits, and a local HTTP receiver standing in for the team's chat."""
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from services import webhook_receiver

    with webhook_receiver() as receiver:
        stack.alert_webhook = receiver.url
        stack.install_alert()
        stack.install_alert()  # set-up run twice keeps one automation
        line = (
            "tiny file · onnx fp32 · CPU · online concurrency 4 · throughput: regression -13.7%; model instances: 2 → 1"
        )
        with temporary_settings({PREFECT_API_URL: stack.api_url}):
            from prefect.automations import Automation

            assert Automation.read(name="tbench: a series regressed").actions[0].type == "send-notification"
        # from a process of its own, as a flow run emits it (this one's events client may serve another test's server)
        emitted = in_stack(stack, [sys.executable, "-c", EMIT, line], timeout=120)
        assert emitted.returncode == 0, emitted.stderr[-2000:]
        received = receiver.wait(60)
    assert received, "the automation did not post to the webhook within 60 s"
    (message,) = received
    assert message["subject"] == "tbench: tiny regressed in run tiny-run-1"
    assert line in message["text"] and "s3://tbench/runs/history/index.html" in message["text"]


def test_the_deployment_form_shows_our_fields_with_their_descriptions(stack):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("triton-benchmark/benchmark-a100")
        pools = {p.name: p for p in client.read_work_pools()}
    schema = deployment.parameter_openapi_schema
    request = schema["definitions"]["BenchmarkRequest"]["properties"]
    assert "Registered model adapter name" in request["model"]["description"]
    assert "p99" not in request["model"]["description"] and "batch_sizes" in request
    assert deployment.work_pool_name == "a100" and not any(s.active for s in deployment.schedules)
    assert pools["a100"].base_job_template["variables"]["properties"]["env"]["default"]["TBENCH_POOL_GPU"] == "A100"
    assert {"cpu", "a100", "v100", "t4", "a30", "a40", "h100"} <= set(pools)


def test_a_worker_without_the_pools_gpu_refuses_the_run(stack):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tbench.team.submit import follow

    with temporary_settings({PREFECT_API_URL: stack.api_url}):
        # the cpu pool's worker, told by the run's job variables that it serves the A100 pool
        run = run_deployment(
            "triton-benchmark/benchmark-cpu",
            parameters={"request": {"model": "resnet50", "size": "small"}},
            job_variables={"env": {"TBENCH_POOL_GPU": "A100"}},
            timeout=0,
        )
        lines: list[str] = []
        result = follow(run.id, lines.append, timeout_s=300)
        with get_client(sync_client=True) as client:
            message = client.read_flow_run(run.id).state.message
    assert result.state == "FAILED", lines
    assert "promises A100 GPUs but the machine has none" in (message + "\n".join(lines))


def test_stopping_s3_mid_run_loses_nothing_and_a_retry_finishes_the_upload(stack):
    staging = stack.root / "staging"
    before = set(staging.glob("resnet50-*"))
    submitted = in_stack(stack, [TBENCH, "submit", *SMALL_RUN, "--pool", "cpu", "--no-follow"])
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    run_id = submitted.stdout.strip().splitlines()[-1]
    deadline = time.monotonic() + 300
    measured = None
    while time.monotonic() < deadline:  # the first measured point is on the worker's disk: take the store away
        measured = next(
            (p / "results.csv" for p in set(staging.glob("resnet50-*")) - before if (p / "results.csv").exists()), None
        )
        if measured is not None:
            break
        time.sleep(0.2)
    assert measured is not None, "no point was measured"
    stack.s3.stop()
    try:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from tbench.team.submit import follow

        with temporary_settings({PREFECT_API_URL: stack.api_url}):
            result = follow(__import__("uuid").UUID(run_id), lambda line: None, timeout_s=400)
        assert result.state == "FAILED" and "could not upload the run" in result.message, result
        run_dir = measured.parent
        manifest = json.loads((run_dir / "manifest.json").read_text())
        import pandas as pd

        results = pd.read_parquet(run_dir / "results.parquet")
        assert len(results) == 3 and (results["status"] == "ok").all()  # every point measured is kept locally
        assert str(run_dir) in result.message and f"tbench upload {run_dir}" in result.message
    finally:
        stack.s3.start()
        stack.s3.create_bucket()
    uploaded = in_stack(stack, [TBENCH, "upload", str(run_dir)])
    assert uploaded.returncode == 0, uploaded.stderr[-2000:]
    stored = read_back(stack, uploaded.stdout.strip().splitlines()[-1])
    assert stored["manifest"]["run_id"] == manifest["run_id"] and stored["ok"] == 3
    assert {e["path"] for e in manifest["files"]} <= set(stored["present"])


def test_a_killed_worker_loses_nothing_and_a_rerun_with_reuse_measures_only_the_rest(
    stack, tmp_path, monkeypatch, never_started
):
    import pandas as pd
    import psutil
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # a worker with an empty point cache of its own: no point of an earlier run can be taken for this one's
    monkeypatch.setenv("TBENCH_POINT_CACHE_DIR", str(tmp_path / "points"))
    stack.stop_worker()
    stack.start_worker()
    staging = stack.root / "staging"
    before = set(staging.glob("resnet50-*"))
    run = SMALL_RUN + ["--batch-sizes", "1,2,4"]  # 3 offline points and the online one
    submitted = in_stack(stack, [TBENCH, "submit", *run, "--pool", "cpu", "--no-follow", "--reuse"])
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    deadline, killed_dir = time.monotonic() + 300, None
    while time.monotonic() < deadline and killed_dir is None:  # one point measured: the worker's machine goes down
        killed_dir = next((p for p in set(staging.glob("resnet50-*")) - before if (p / "results.csv").exists()), None)
        time.sleep(0.2)
    assert killed_dir is not None, "no point was measured"
    worker = psutil.Process(stack.worker.pid)
    measuring = ("tritonserver", "triton_python_backend_stub", "perf_analyzer")
    for p in [worker, *worker.children(recursive=True)]:  # the worker and the flow run's process, not what they started
        if p.name() not in measuring:
            p.kill()
    stack.worker.wait()
    kept = pd.read_csv(killed_dir / "results.csv")
    assert 1 <= len(kept) < 4, kept  # killed in the middle of the sweep
    orphaned = [
        p for p in psutil.process_iter(["cmdline"]) if any(str(killed_dir) in a for a in p.info["cmdline"] or [])
    ]
    assert orphaned  # its server outlived it
    stack.start_worker()
    rerun = in_stack(stack, [TBENCH, "submit", *run, "--pool", "cpu", "--reuse"])
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    report = next(
        line.split("report:", 1)[1].strip() for line in (rerun.stdout + rerun.stderr).splitlines() if "report:" in line
    )
    results = pd.DataFrame(read_back(stack, report.rsplit("/", 1)[0])["rows"])  # stored, so no longer on the worker
    reused = results[results["reused_from"] == killed_dir.name]
    # every point measured (a busy machine may leave a fresh one unstable: measured all the same, and kept)
    assert len(results) == 4, results["status"]
    measured(results)
    assert len(reused) == int((kept["status"] == "ok").sum())  # nothing measured before the kill is measured again
    assert not [p for p in orphaned if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # stopped by the re-run
    # its folder says how it ended: the re-run found its `running` manifest, its process gone, and rewrote it
    from tbench.stages.killed import KILLED_STAGE, killed_message

    said = json.loads((killed_dir / "manifest.json").read_text())
    assert said["status"] == "failed" and said["failed_stage"] == KILLED_STAGE
    assert said["error"] == killed_message(len(kept))
    # the killed run is not left Running for ever: the re-run found its folder killed and marked it Crashed with the
    # folder's message, unless the automation saw its heartbeats stop first
    from tbench.team.zombies import message, never_started_message

    killed_run = UUID(submitted.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 150
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        while (state := client.read_flow_run(killed_run).state).type.value == "RUNNING" and time.monotonic() < deadline:
            time.sleep(2)
    assert state.type.value == "CRASHED", state
    assert state.message in (killed_message(len(kept)), message(stack.zombie_silence_s)), state
    deadline = time.monotonic() + stack.never_started_s + 60  # at most: Pending since the module's first test
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        while (state := client.read_flow_run(never_started).state).type.value == "PENDING":
            if time.monotonic() > deadline:
                break
            time.sleep(2)
    assert state.type.value == "CRASHED" and state.message == never_started_message(stack.never_started_s), state


def test_the_matrix_fans_out_through_the_deployments_and_compares(stack, monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.matrix import MatrixRequest, matrix_flow

    for key, value in stack.client_env().items():
        monkeypatch.setenv(key, value)
    matrix = MatrixRequest(
        models=["resnet50"],
        formats=["onnx", "ts-trace"],
        pools=["cpu"],
        request={
            "size": "small",
            "batch_sizes": [4],
            "concurrency": [2],
            "scenarios": ["offline"],
            "measurement": {"stability_percentage": 50, "window_s": 0.5},
        },
    )
    with temporary_settings({PREFECT_API_URL: stack.api_url}):
        url = matrix_flow(matrix)
    assert url.startswith("s3://tbench/runs/matrix-")
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    manifest = json.loads(fs.cat_file(path + "/manifest.json"))
    assert [r["state"] for r in manifest["runs"]] == ["COMPLETED", "COMPLETED"]
    assert not Path(manifest["local_dir"]).exists()  # stored: the parent's folder leaves staging too
    assert {r["format"] for r in manifest["runs"]} == {"onnx", "ts-trace"}
    report = fs.cat_file(path + "/report.md").decode()
    assert "## Best points per GPU" in report and "CPU: best infer/s" in report
    assert "| onnx " in report and "| ts-trace " in report
    assert fs.exists(path + "/plots/resnet50_onnx_FP32_offline_gpus.png") and fs.exists(path + "/report.html")


def test_a_matrix_child_past_its_limit_is_cancelled_on_its_worker(stack, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.matrix import MatrixRequest, matrix_flow

    for key, value in stack.client_env().items():
        monkeypatch.setenv(key, value)
    # long enough for the worker to start the child (it is then exporting or serving), far too short to finish it
    matrix = MatrixRequest(
        models=["resnet50"],
        formats=["onnx"],
        pools=["cpu"],
        child_timeout_s=20,
        request={"size": "small", "batch_sizes": [1, 2, 4, 8], "concurrency": [1, 2]},
    )
    with temporary_settings({PREFECT_API_URL: stack.api_url}):
        state = matrix_flow(matrix, return_state=True)
        assert state.is_failed() and "1 of 1 child runs did not finish" in state.message, state.message
        url = state.message.rsplit(" is at ", 1)[1]
        import fsspec

        fs, path = fsspec.core.url_to_fs(url)
        child = json.loads(fs.cat_file(path + "/manifest.json"))["runs"][0]
        assert child["state"] == "CANCELLED", child
        assert child["reason"] == "did not finish within 20 s (state RUNNING); cancelled", child
        assert child["flow_run"] in fs.cat_file(path + "/report.md").decode().split("## Runs that did not finish", 1)[1]
        with get_client(
            sync_client=True
        ) as client:  # Cancelled comes from the worker, once it killed the run's process
            assert client.read_flow_run(child["flow_run"]).state.type.value == "CANCELLED"
