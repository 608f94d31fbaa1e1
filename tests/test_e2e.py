"""End to end with the real embedded tritonserver and the real perf_analyzer, on the small ResNet-50."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import time

import numpy as np
import pandas as pd
import psutil
import pytest
from conftest import GOLDEN, measured
from test_faults import lasting_unmapped_regions

from tbench.core import progress
from tbench.core.enums import Scenario
from tbench.core.errors import ServerStartError
from tbench.core.layout import RunLayout
from tbench.core.metrics import OK, RESULT_COLUMNS, SERVER_COLUMNS
from tbench.core.runtimes import run_pytorch
from tbench.loadgen.perf_analyzer import Point, pass_throughputs
from tbench.node import shm
from tbench.request.benchmark import BenchmarkRequest, Measurement
from tbench.stages.accuracy import infer_triton, measure_accuracy
from tbench.stages.sweep import plan_points, run_sweep
from tbench.triton.monitor import PointMonitor
from tbench.triton.process_server import EmbeddedServer, LocalServer
from tbench.triton.remote_server import RemoteServer
from tbench.triton.repository import ServingConfig, build_config, write_repository
from tbench.triton.server import configs_to_load, load_all

pytestmark = pytest.mark.e2e


def stubs(pgid: int | None = None) -> list[psutil.Process]:
    """Live python-backend stub processes, those of one server's process group when `pgid` is given."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "triton_python_backend_stub" in " ".join(p.info["cmdline"] or []) and (
                pgid is None or os.getpgid(p.pid) == pgid
            ):
                found.append(p)
        except ProcessLookupError:
            pass
    return found


def test_served_outputs_match_the_framework(served_small, small_adapter, small_module):
    import tritonclient.grpc as grpcclient

    inputs = small_adapter.sample_batch(3, seed=11)
    client = grpcclient.InferenceServerClient(served_small.endpoints.grpc_url)
    got = infer_triton(client, "resnet50", small_adapter.io_spec(), inputs)
    want = run_pytorch(small_module, small_adapter.io_spec(), inputs)
    np.testing.assert_allclose(got["output__0"], want["output__0"], atol=1e-4, rtol=1e-4)
    client.close()


def test_accuracy_through_triton_agrees_with_the_framework(served_small, small_adapter, small_module):
    result = measure_accuracy(
        small_adapter, small_module, served_small.endpoints.grpc_url, "resnet50", samples=20, batch_size=8
    )
    assert result.samples == 20 and result.agreement == 1.0 and result.difference == 0.0
    assert 0.0 <= result.framework <= 1.0
    assert result.passed and [o.output for o in result.outputs] == ["output__0"]


def test_top1_on_an_imagenet_folder_through_triton(served_small, small_module, tmp_path):
    """The guide's accuracy check: labelled JPEGs in class folders, standard preprocessing, top-1 both ways."""
    from PIL import Image

    import model_adapters

    rng = np.random.default_rng(3)
    for c in range(3):
        (tmp_path / f"n0{c}").mkdir()
        for i in range(3):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(tmp_path / f"n0{c}" / f"{i}.JPEG")
    adapter = model_adapters.get("resnet50", "small", data_dir=str(tmp_path))
    result = measure_accuracy(
        adapter, small_module, served_small.endpoints.grpc_url, "resnet50", samples=100, batch_size=4
    )
    assert result.metric == "top1" and result.samples == 9 and result.agreement == 1.0 and result.passed
    assert result.framework == result.triton


def test_sweep_keeps_measured_points_and_flags_an_unstable_one(served_small, small_artifacts, tmp_path):
    layout = RunLayout(tmp_path, "sweep").create()
    seen = []
    points = [Point(Scenario.OFFLINE, 1, 1), Point(Scenario.OFFLINE, 4, 1), Point(Scenario.ONLINE, 1, 2)]
    monitor = PointMonitor(served_small.endpoints.grpc_url, "resnet50", served_small.processes, interval_s=0.2)
    windows = []  # what the terminal's bar is told while each point runs

    def on_event(event: str, **data) -> None:
        if event == "point_window":
            windows.append(data)

    progress.subscribe(on_event)
    try:
        table = run_sweep(
            points,
            model="resnet50",
            grpc_url=served_small.endpoints.grpc_url,
            spec=small_artifacts[0].io_spec,
            m=Measurement(window_s=1.0, stability_percentage=50, max_trials=8),
            layout=layout,
            static={"model": "resnet50"},
            on_row=lambda t: seen.append(len(t)),
            monitor=monitor,
        )
    finally:
        progress.unsubscribe(on_event)
    assert list(table.columns) == RESULT_COLUMNS and seen == [1, 2, 3]
    # every point told its windows as perf_analyzer measured them, the last with its last 3 within the band
    assert {w["point"] for w in windows} == {p.describe() for p in points}
    for p in points:
        told = [w for w in windows if w["point"] == p.describe()]
        assert [w["window"] for w in told] == sorted({w["window"] for w in told}) and told[-1]["window"] >= 3
        assert told[-1]["spread_pct"] <= told[-1]["band_pct"] == 50
    assert sorted(table["point_index"]) == [0, 1, 2]  # measured in a shuffled order, each point once
    table = table.sort_values(["scenario", "batch_size"]).reset_index(drop=True)
    assert (table["status"] == "ok").all(), table[["status", "error"]]
    assert (table["throughput_infer_per_s"] > 0).all()
    assert (table["p99_ms"] >= table["p50_ms"]).all() and (table["avg_ms"] > 0).all()
    assert table["shared_memory"].tolist() == ["system", "system", "none"]
    offline_b4 = table[(table["scenario"] == "offline") & (table["batch_size"] == 4)].iloc[0]
    assert offline_b4["throughput_infer_per_s"] > table.iloc[0]["throughput_infer_per_s"]  # batching pays off
    assert (layout.run_dir / table.iloc[0]["source_file"]).exists()
    # the server's own account of the same requests: Triton's statistics API agrees with perf_analyzer's breakdown
    assert (table["triton_requests"] >= table["measurement_request_count"]).all()
    # windows sized by time: about window_s (1 s), a fast model's holding many requests
    assert (table["window_s"] > 0.9).all() and (table["measurement_request_count"] > 20).all(), table[
        ["window_s", "measurement_request_count"]
    ]
    # the cross-check holds for the model's own time per request (compute infer) at concurrency 1; the queue time is
    # the batcher thread's wake-up, a tenth of a millisecond that a loaded machine changes between the warm-up and the
    # windows (0.16 against under 0.05 ms, 71% apart, seen in a full suite), and at concurrency 2 the arrivals' timing,
    # so their difference is only computed
    offline = table.loc[table["scenario"] == "offline"]
    compute_diff = cross_check_of(offline, "triton_compute_infer_ms")
    assert (table["triton_compute_infer_ms"] > 0).all() and (compute_diff < 0.5).all(), table[SERVER_COLUMNS]
    assert table["stats_max_rel_diff"].notna().all()
    assert (table["server_cpu_pct"] > 0).all() and (
        table["server_rss_mb"] > 10
    ).all()  # the server's processes, sampled
    assert table["gpu_util_pct"].isna().all()  # no GPU here: nothing is made up

    # an impossible stability target: retried with a longer window, then recorded as unstable; nothing else lost
    unstable = run_sweep(
        [Point(Scenario.ONLINE, 1, 2)],
        model="resnet50",
        grpc_url=served_small.endpoints.grpc_url,
        spec=small_artifacts[0].io_spec,
        m=Measurement(
            window_s=0.5, max_window_s=0.5, min_requests=8, stability_percentage=0.001, max_trials=3, retries=1
        ),
        layout=layout,
        static={},
    )
    row = unstable.iloc[0]
    assert row["status"] == "unstable" and row["attempts"] == 2 and pd.isna(row["throughput_infer_per_s"])
    # the retry's windows are sized from the throughput the failed attempt saw: twice the target duration
    # the same point measured above kept its files (try0): this sweep's attempts are try1 and try2
    first_log = (layout.logs_dir / "perf_analyzer" / "resnet50_online_b1_c2_try1.log").read_text()
    assert (layout.logs_dir / "perf_analyzer" / "resnet50_online_b1_c2_try0.log").exists()
    rate = np.median(pass_throughputs(first_log))
    assert row["measurement_request_count"] == max(8, int(np.ceil(2 * 0.5 * rate)))


def test_open_loop_rate_points_measure_what_the_server_keeps_up_with(served_small, small_artifacts, tmp_path):
    layout = RunLayout(tmp_path, "rate").create()
    points = plan_points([Scenario.RATE], [], [], rates=[20.0, 40.0], distribution="poisson")
    grpc_url = served_small.endpoints.grpc_url
    # the embedded server's tracer crashes under load (ServerCapabilities.traces_safely): it offers no trace
    assert served_small.request_trace("resnet50") is None
    monitor = PointMonitor(grpc_url, "resnet50", trace=None)
    table = run_sweep(
        points,
        model="resnet50",
        grpc_url=grpc_url,
        spec=small_artifacts[0].io_spec,
        m=Measurement(window_s=0.1, min_requests=60, stability_percentage=50, max_trials=8),
        layout=layout,
        static={},
        monitor=monitor,
    )
    # the server kept up at both rates: ok, or client_bound where perf_analyzer's sender, starved by the suite's other
    # workers on 2 cores, sent too many requests late (seen once in 4 suites: 4.31% late at 40/s, the server keeping up)
    assert set(table["status"]) <= {"ok", "client_bound"}, table[["status", "error"]]
    # a request of 3x32x32 floats is too large for perf_analyzer's export, and this server keeps no trace: whether it
    # kept up was read from the windows
    assert set(table["requests_from"]) == {"windows"} and monitor.requests is None
    assert table["request_rate"].tolist() == [20.0, 40.0] and set(table["request_distribution"]) == {"poisson"}
    assert table["concurrency"].isna().all()
    # a small model on 2 cores keeps up with 20-40 requests/s: throughput near the offered rate (poisson arrivals
    # over a 60-request window vary by ~13%, so the bounds are ~3 standard deviations)
    assert ((table["throughput_infer_per_s"] / table["request_rate"]).between(0.6, 1.4)).all(), table[
        "throughput_infer_per_s"
    ]
    assert (layout.perf_dir / "resnet50_rate_b1_r40_poisson_try0.csv").exists()


def cross_check_of(table: pd.DataFrame, ours: str) -> pd.Series:
    """The cross-check (tbench.triton.monitor.cross_check) of one stage alone, per row."""
    from tbench.triton.monitor import CHECKED_AGAINST, cross_check

    return table.apply(
        lambda row: cross_check({ours: row[ours], CHECKED_AGAINST[ours]: row[CHECKED_AGAINST[ours]]}), axis=1
    )


def test_dynamic_batching_runs_concurrent_requests_in_one_runtime_call(served_small, small_artifacts, tmp_path):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(served_small.endpoints.grpc_url)

    def counts():
        stats = client.get_inference_statistics("resnet50").model_stats[0]
        return stats.inference_count, stats.execution_count

    inferences0, executions0 = counts()
    run_sweep(
        [Point(Scenario.ONLINE, 1, 8)],
        model="resnet50",
        grpc_url=served_small.endpoints.grpc_url,
        spec=small_artifacts[0].io_spec,
        m=Measurement(window_s=0.5, stability_percentage=80),
        layout=RunLayout(tmp_path, "batching").create(),
        static={},
    )
    inferences1, executions1 = counts()
    client.close()
    # batch-1 requests from 8 clients: the dynamic batcher hands several to one execute() call
    assert inferences1 - inferences0 > 1.5 * (executions1 - executions0) > 0


def test_golden_config_loads_in_the_real_server(small_artifacts, tmp_path):
    model_dir = write_repository(
        tmp_path / "repo", ServingConfig("resnet50", 8, [4, 8], 2000, 2, intra_op_threads=1), small_artifacts[0]
    )
    shutil.copy(GOLDEN / "config" / "resnet50_small_onnx.pbtxt", model_dir / "config.pbtxt")
    with EmbeddedServer(tmp_path / "repo", tmp_path / "server.log") as server:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(server.endpoints.http_url)
        try:
            assert client.is_model_ready("resnet50")
            assert client.get_model_config("resnet50")["instance_group"][0]["count"] == 2
        finally:
            client.close()  # an open connection holds Triton's exit for its 30 s exit timeout


@pytest.mark.parametrize("how", ["sigterm", "server killed"])
def test_stop_leaves_no_stub_process_or_shared_memory_and_spares_other_servers(
    how, served_small, small_artifacts, tmp_path
):
    others = shm.mapped_regions(served_small._group())  # a server running beside ours
    assert others
    write_repository(tmp_path / "repo", ServingConfig("resnet50", 8, [8], 100, 1), small_artifacts[0])
    server = EmbeddedServer(tmp_path / "repo", tmp_path / "server.log")
    server.start()
    pid = server.proc.pid
    ours = shm.mapped_regions(server._group())
    assert ours and not ours & others and stubs(pgid=pid)
    if how == "server killed":  # the worst case: the stubs lose their parent
        os.kill(pid, signal.SIGKILL)
        server.proc.wait()
    server.stop()
    assert not stubs(pgid=pid)
    assert not [r for r in ours if r.exists()]
    assert all(r.exists() for r in others) and served_small.alive()


def test_a_server_killed_with_its_stubs_leaves_no_region_of_a_model_loaded_after_it_started(small_artifacts, tmp_path):
    """Offline points load models into a running server: their stubs' regions are created after the start. A group
    killed at once (a stub gone before anyone looked at what it mapped) must still leave none of them behind."""
    import tritonclient.grpc as grpcclient

    write_repository(tmp_path / "repo", ServingConfig("resnet50", 8, [8], 100, 1), small_artifacts[0])
    server = EmbeddedServer(tmp_path / "repo", tmp_path / "server.log", model_control="explicit")
    server.start()
    client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
    try:
        client.load_model("resnet50")
    finally:
        client.close()
    pid = server.proc.pid
    late = shm.named(server.shm_prefix)
    assert late and late <= shm.mapped_regions(server._group())  # named as ours, and mapped by our stubs
    os.killpg(pid, signal.SIGKILL)
    server.proc.wait()
    deadline = time.monotonic() + 10
    while stubs(pgid=pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not shm.mapped_regions(server._group())  # nothing left that maps them: only their names tell them
    server.stop()
    assert not [r for r in late if r.exists()]


def test_the_instances_serving_a_model_are_read_from_the_server(served_small):
    """The window rule of a rate point (docker, remote) weighs the server's compute time per request against them."""
    from tbench.triton.served import serving_instances

    assert serving_instances(served_small.endpoints.grpc_url, "resnet50") == 1
    assert serving_instances(served_small.endpoints.grpc_url, "no-such-model") is None


def test_a_model_that_fails_to_load_names_the_reason(small_artifacts, tmp_path):
    model_dir = write_repository(tmp_path / "repo", ServingConfig("resnet50", 8, [8], 100, 1), small_artifacts[0])
    (model_dir / "1" / "model.onnx").unlink()
    (model_dir / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    with pytest.raises(ServerStartError) as err:
        EmbeddedServer(tmp_path / "repo", tmp_path / "server.log", start_timeout_s=120).start()
    message = str(err.value)
    assert "\n" not in message and "server.log" in message and "resnet50" in message


def test_a_launched_server_is_waited_for_by_start_and_stopped_whole_before_it(small_artifacts, tmp_path):
    """The run launches the server before its correctness check and waits in server-start: a run interrupted in
    between stops a server whose models are still loading, and leaves no process, region or trace folder behind."""
    write_repository(tmp_path / "repo", ServingConfig("resnet50", 8, [8], 100, 1), small_artifacts[0])
    server = EmbeddedServer(tmp_path / "repo", tmp_path / "server.log")
    server.launch()
    pid, scratch = server.proc.pid, server._scratch()
    assert server.alive() and scratch
    with pytest.raises(ServerStartError, match="already running"):
        server.launch()
    server.stop()  # an interrupt during the correctness check: the models may still be loading
    assert not server.alive() and not stubs(pgid=pid) and not shm.named(server.shm_prefix)
    assert not any(path.exists() for path in scratch)
    server.launch()
    try:
        # waits for the launched one, not another
        assert server.start() == server.endpoints and server.stopped_serving() is None
        assert server.processes()[0].pid == server.proc.pid
    finally:
        server.stop()


def test_a_second_start_is_refused_instead_of_orphaning_the_first_server(served_small):
    pid = served_small.proc.pid
    with pytest.raises(ServerStartError, match="already running"):
        served_small.start()
    assert served_small.proc.pid == pid and served_small.alive()


@pytest.mark.parametrize("port", ["http", "metrics"])
def test_a_port_taken_before_the_server_binds_it_is_not_taken_for_ours(port, served_small, small_artifacts, tmp_path):
    """A port taken between our pick and our server's bind: the HTTP port by another server, which answers ready for
    a model of the same name, or the metrics port, which Triton binds last, after HTTP answers. Ours exits; the
    start is not fooled, and tries again on fresh ports."""
    import tritonclient.grpc as grpcclient

    write_repository(tmp_path / "repo", ServingConfig("resnet50", 8, [8], 100, 1), small_artifacts[0])
    server = EmbeddedServer(tmp_path / "repo", tmp_path / "server.log")
    before = set(lasting_unmapped_regions())
    with socket.socket() as listener:
        if port == "http":
            taken = server.ports["http"] = served_small.ports["http"]  # as if it had been free when picked
        else:
            listener.bind(("127.0.0.1", server.ports["metrics"]))
            listener.listen()
            taken = server.ports["metrics"]
        with server:
            assert server.ports[port] != taken
            assert server.log_path.read_text().count("$ ") == 2  # the failed try's log is kept
            for url in (server.endpoints.grpc_url, served_small.endpoints.grpc_url):
                with grpcclient.InferenceServerClient(url) as client:
                    assert client.is_model_ready("resnet50")
            with grpcclient.InferenceServerClient(server.endpoints.grpc_url) as client:
                assert client.get_server_metadata().name == server.instance_id
            time.sleep(1.0)
            assert server.alive()
            assert server.identity()["id"] == "triton"  # one server, whichever start measured
    assert served_small.alive() and not set(lasting_unmapped_regions()) - before


def test_a_port_in_use_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerStartError, match=f"port {port} on 127.0.0.1 is already in use"):
            EmbeddedServer(GOLDEN, GOLDEN / "unused.log", http_port=port)


def test_flow_run_serves_every_pytorch_format_and_reports_each(prefect_harness, tmp_path):
    from flows.benchmark import benchmark_flow

    url = benchmark_flow(
        BenchmarkRequest(
            model="resnet50",
            size="small",
            output=str(tmp_path),
            batch_sizes=[4],
            concurrency=[4],
            formats=["onnx", "ts-trace", "ts-script"],
            serve_formats=["all"],
            measurement=Measurement(window_s=0.5, stability_percentage=50),
        )
    )
    run = tmp_path / url.rsplit("/", 1)[-1]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["failed_stage"] is None
    listed = {f["path"] for f in manifest["files"]}
    for expected in (
        "report.md",
        "results.csv",
        "results.parquet",
        "logs/tritonserver.log",
        "logs/prefect.log",
        "plots/formats_throughput.png",
        "model_repository/resnet50_onnx/config.pbtxt",
        "model_repository/resnet50_ts_script/config.pbtxt",
        "models/onnx/model.onnx",
        "models/ts-trace/model.pt",
        "models/ts-script/model.pt",
        "correctness.json",
        "accuracy.json",
    ):
        assert expected in listed and (run / expected).exists(), expected
    results = pd.read_parquet(run / "results.parquet")
    ok = measured(results)
    # a picture for each point with numbers (a point left unstable by a busy machine has none, and says why)
    stable = set(zip(ok["format"], ok["scenario"], strict=True))
    for fmt, scenario, plot in (
        ("onnx", "offline", "plots/onnx_offline_throughput_vs_batch.png"),
        ("ts-trace", "offline", "plots/ts-trace_offline_latency_vs_batch.png"),
        ("ts-script", "online", "plots/ts-script_online_latency_breakdown_throughput.png"),
    ):
        assert ((fmt, scenario) in stable) == (plot in listed and (run / plot).exists()), (fmt, scenario, plot)
    for fmt in ("onnx", "ts-trace", "ts-script"):
        mine = results[results["format"] == fmt]
        assert sorted(zip(mine["scenario"], mine["batch_size"], mine["concurrency"])) == [
            ("offline", 4, 1),
            ("online", 1, 4),
        ], fmt
    assert set(results["gpu"]) == {"CPU"} and set(results["model_format"]) == {"ONNX", "TorchScript"}
    # offline: static batching (the model's own speed, not the batcher's queue delay); online: the config under test
    offline, online = results[results["scenario"] == "offline"], results[results["scenario"] == "online"]
    assert set(offline["batching"]) == {"static"} and (offline["max_queue_delay_us"] == 0).all()
    offline_ok = offline[offline["status"] == OK]
    # no batcher's wait in an offline point's queue (2 ms here): well under it (a starved server's pick-up took 0.7 ms)
    batcher_wait_ms = manifest["request"]["max_queue_delay_us"] / 1000
    assert (offline_ok["server_queue_ms"] < batcher_wait_ms / 2).all(), offline_ok[["format", "server_queue_ms"]]
    assert (
        set(online["batching"]) == {"dynamic"}
        and (online["max_queue_delay_us"] == manifest["request"]["max_queue_delay_us"]).all()
    )
    assert "model_repository/resnet50_onnx/configs/offline.pbtxt" in listed  # served from the start: no reload
    assert not any(stage.startswith("reload-offline") for stage in manifest["stages"])
    # the embedded server has only the python backend
    assert set(results["backend"]) == {"python (onnxruntime)", "python (torchscript)"}
    accuracy = json.loads((run / "accuracy.json").read_text())
    assert [a["format"] for a in accuracy] == ["onnx", "ts-trace", "ts-script"] and all(
        a["metric"] == "top1" for a in accuracy
    )
    report = (run / "report.md").read_text()
    sections = [line for line in report.splitlines() if line.startswith("## Format")]
    assert sections == ["## Format `onnx`", "## Format `ts-trace`", "## Format `ts-script`"]
    for fmt in ("onnx", "ts-trace", "ts-script"):
        section = report.split(f"## Format `{fmt}`")[1].split("\n## ")[0]
        assert "### Correctness" in section and "### Accuracy through Triton" in section
        assert "### Offline scenario" in section and "### Online scenario" in section
        # a scenario whose points a busy machine left unstable says so in its section (they are flagged at the end)
        for scenario in ("offline", "online"):
            part = section.split(f"### {scenario.title()} scenario")[1].split("\n### ")[0]
            says_none = "No point of this scenario passed its checks" in part
            assert says_none == ((fmt, scenario) not in stable), (fmt, scenario)
        if (fmt, "offline") in stable:
            assert "| Precision   | Backend Accelerator   |   Client Batch Size |   Inferences/second |" in section
        if (fmt, "online") in stable:
            assert "Network+server Send/recv" in section
    assert "Served by: python (torchscript)." in report
    assert "CPU probe (M steps/s)" in report and " after " in report  # the machine's speed, both sides of the sweeps
    assert "While measuring (% of one CPU)" in report
    assert "AMD" in report or "Intel" in report or "CPU cores" in report


def test_a_failed_run_keeps_its_logs_and_says_where(prefect_harness, tmp_path):
    from flows.benchmark import benchmark_flow

    # a server that passes the preflight (its binary runs, its backend folder has a python backend) and exits at once
    backends = tmp_path / "backends" / "python"
    backends.mkdir(parents=True)
    (backends / "libtriton_python.so").touch()
    with pytest.raises(ServerStartError, match="exited"):
        benchmark_flow(
            BenchmarkRequest(
                model="resnet50",
                size="small",
                output=str(tmp_path / "runs"),
                server="local",
                tritonserver="/bin/false",
                backend_dir=str(backends.parent),
            )
        )
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["failed_stage"] == "server-start"
    assert "exited" in manifest["error"]
    assert manifest["stages"]["export"]["status"] == "completed"
    assert (run / "correctness.json").exists() and (run / "report.md").exists()
    assert "status **failed**" in (run / "report.md").read_text()


def test_python_runtime_serves_multi_io_integer_and_variable_length_requests(tmp_path):
    """Two inputs (int64 tokens with a dynamic length, a float scale), two outputs. Triton batches queued requests
    of the same shape (it closes a batch at the first other shape): each batch must be split back correctly."""
    import torch
    import tritonclient.grpc as grpcclient

    from tbench.core.artifacts import ModelArtifact
    from tbench.core.enums import Format, Precision
    from tbench.core.iospec import IoSpec, TensorSpec

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(50, 4)

        def forward(self, tokens, scale):
            emb = self.table(tokens) * scale.unsqueeze(-1)
            return emb, (tokens > 0).sum(dim=1, keepdim=True)

    module = Embed().eval()
    path = tmp_path / "model.onnx"
    torch.onnx.export(
        module,
        (torch.ones(2, 5, dtype=torch.int64), torch.ones(2, 1)),
        str(path),
        input_names=["tokens", "scale"],
        output_names=["emb", "count"],
        dynamo=False,
        opset_version=17,
        dynamic_axes={"tokens": {0: "b", 1: "t"}, "scale": {0: "b"}, "emb": {0: "b", 1: "t"}, "count": {0: "b"}},
    )
    spec = IoSpec(
        inputs=[
            TensorSpec(name="tokens", dtype="int64", shape=[-1]),
            TensorSpec(name="scale", dtype="float32", shape=[1]),
        ],
        outputs=[
            TensorSpec(name="emb", dtype="float32", shape=[-1, 4]),
            TensorSpec(name="count", dtype="int64", shape=[1]),
        ],
    )
    artifact = ModelArtifact(
        format=Format.ONNX, precision=Precision.FP32, path=str(path), io_spec=spec, source_hash="x", seconds=0
    )
    write_repository(tmp_path / "repo", ServingConfig("embed", 8, [8], 5_000_000, 1), artifact)
    rng = np.random.default_rng(0)
    requests = [
        (rng.integers(0, 50, (rows, n)), np.full((rows, 1), 0.5 * (i + 1), np.float32))
        for i, (rows, n) in enumerate([(1, 3), (2, 3), (1, 7), (1, 7), (2, 11)])
    ]
    with EmbeddedServer(tmp_path / "repo", tmp_path / "server.log") as server:
        client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
        before = client.get_inference_statistics("embed").model_stats[
            0
        ]  # also opens the connection before timing matters
        prepared = []  # built before any is sent, so that all five are in flight together
        for tokens, scale in requests:
            inputs = [
                grpcclient.InferInput("tokens", list(tokens.shape), "INT64"),
                grpcclient.InferInput("scale", list(scale.shape), "FP32"),
            ]
            inputs[0].set_data_from_numpy(tokens)
            inputs[1].set_data_from_numpy(scale)
            prepared.append(inputs)
        results = {}
        for i, inputs in enumerate(prepared):  # the 5 s queue delay gathers them, even on a machine busy elsewhere
            client.async_infer(
                "embed", inputs, callback=lambda result, error, i=i: results.__setitem__(i, (result, error))
            )
            # a request of another shape closes the batch the batcher holds, and concurrent calls may reach its queue in
            # any order (3, 7, 3, 7, 11: five executions, seen with one core kept busy): the first pair is queued whole
            # before any other shape is sent
            if i == 1:
                time.sleep(1.0)
        deadline = time.monotonic() + 30
        while len(results) < len(requests) and time.monotonic() < deadline:
            time.sleep(0.05)
        # the server counts an execution after its responses are on their way: the last one's count can lag a moment
        while time.monotonic() < deadline:
            stats = client.get_inference_statistics("embed").model_stats[0]
            if stats.inference_count - before.inference_count >= 7:
                break
            time.sleep(0.05)
        client.close()
    assert len(results) == len(requests)
    for i, (tokens, scale) in enumerate(requests):
        result, error = results[i]
        assert error is None, error
        want_emb, want_count = (t.detach().numpy() for t in module(torch.from_numpy(tokens), torch.from_numpy(scale)))
        np.testing.assert_allclose(result.as_numpy("emb"), want_emb, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(result.as_numpy("count"), want_count)
    assert stats.inference_count - before.inference_count == 7
    # {3, 3}, {7, 7}, {11} when the last three reach the queue in the order sent; the first pair merged in any case
    assert stats.execution_count - before.execution_count < len(requests)


def test_local_mode_runs_a_tritonserver_found_on_path(small_artifacts, tmp_path, monkeypatch):
    """The embedded binary placed on PATH (behind a wrapper that sets its libraries), with its own backend dir."""
    from tbench.node import tools

    embedded = EmbeddedServer(GOLDEN, GOLDEN / "unused.log")
    embedded._before_launch()  # a backend dir with this Python's stub, as an installed server would have
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "tritonserver"
    env = embedded.env()
    wrapper.write_text(
        f"#!/bin/sh\nexport LD_LIBRARY_PATH='{env['LD_LIBRARY_PATH']}'\nexport PATH='{env['PATH']}'\n"
        f"exec '{tools.pytriton_server_dir() / 'bin' / 'tritonserver'}' \"$@\"\n"
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    write_repository(tmp_path / "repo", ServingConfig("resnet50", 8, [8], 100, 1), small_artifacts[0])
    try:
        server = LocalServer(tmp_path / "repo", tmp_path / "server.log", backend_dir=embedded._work_dir / "backends")
        assert server.binary == str(wrapper) and server.backends() == {"python"}
        with server:
            import tritonclient.http as httpclient

            client = httpclient.InferenceServerClient(server.endpoints.http_url)
            assert client.is_model_ready("resnet50")
            client.close()
        assert not server.alive()
    finally:
        embedded.stop()


def client_models(grpc_url: str) -> list[str]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        return [
            m["name"]
            for m in client.get_model_repository_index(as_json=True).get("models", [])
            if m.get("state") == "READY"
        ]
    finally:
        client.close()


def test_remote_mode_uploads_loads_and_unloads_through_the_client(small_artifacts, small_adapter, tmp_path):
    """A server started by someone else in explicit model control mode, with an empty repository of its own."""
    import tritonclient.grpc as grpcclient

    (tmp_path / "their_repo").mkdir()
    theirs = EmbeddedServer(tmp_path / "their_repo", tmp_path / "their.log", model_control="explicit")
    theirs.start()
    try:
        write_repository(tmp_path / "repo", ServingConfig("resnet50", 8, [8], 100, 1), small_artifacts[0])
        ep = theirs.endpoints
        remote = RemoteServer(tmp_path / "repo", tmp_path / "remote.log", http_url=ep.http_url, grpc_url=ep.grpc_url)
        assert remote.alive()
        assert remote.backends() == {"python"}  # probed: the embedded binary has only the python backend
        log = (tmp_path / "remote.log").read_text()
        assert re.search(r"backend probe onnxruntime as tbench_probe_onnxruntime__tb[0-9a-f]{8}: missing", log)
        probe = re.search(r"backend probe python as (\S+): present", log).group(1)
        assert not grpcclient.InferenceServerClient(ep.grpc_url).is_model_ready(probe)  # loaded, then unloaded
        remote.start()
        client = grpcclient.InferenceServerClient(ep.grpc_url)
        assert client.is_model_ready("resnet50")
        out = infer_triton(client, "resnet50", small_adapter.io_spec(), small_adapter.sample_batch(2))
        assert out["output__0"].shape == (2, 10)
        # the offline scenario's reload with a static-batching config, then back to the repository's own
        static = build_config(ServingConfig("resnet50", 8, [8], 100, 1, batching="static"), small_artifacts[0])
        load_all(remote, configs_to_load(remote, {"resnet50": static}))
        assert not client.get_model_config("resnet50").config.HasField("dynamic_batching")
        assert infer_triton(client, "resnet50", small_adapter.io_spec(), small_adapter.sample_batch(2))[
            "output__0"
        ].shape == (2, 10)
        load_all(remote, configs_to_load(remote, {"resnet50": None}))
        assert client.get_model_config("resnet50").config.dynamic_batching.max_queue_delay_microseconds == 100
        remote.stop()
        assert not client.is_model_ready("resnet50")
        client.close()
        assert "loaded resnet50" in (tmp_path / "remote.log").read_text()
        onnx = tmp_path / "repo" / "resnet50" / "1" / "model.onnx"
        onnx.unlink()
        onnx.write_bytes(b"not onnx")
        broken = RemoteServer(tmp_path / "repo", tmp_path / "remote2.log", http_url=ep.http_url, grpc_url=ep.grpc_url)
        with pytest.raises(ServerStartError, match="remote Triton could not load resnet50") as err:
            broken.start()
        assert "\n" not in str(err.value)
    finally:
        theirs.stop()


def test_regions_a_killed_perf_analyzer_left_registered_are_released(served_small, small_artifacts, tmp_path):
    import tritonclient.grpc as grpcclient

    from tbench.stages.sweep import release_shared_memory

    def registered():
        with grpcclient.InferenceServerClient(served_small.endpoints.grpc_url) as client:
            return sorted(client.get_system_shared_memory_status(as_json=True).get("regions", {}))

    # a point that ends unstable (perf_analyzer then exits without unregistering): nothing stays registered after it
    row = run_sweep(
        [Point(Scenario.OFFLINE, 1, 1)],
        model="resnet50",
        grpc_url=served_small.endpoints.grpc_url,
        spec=small_artifacts[0].io_spec,
        m=Measurement(
            window_s=0.2, max_window_s=0.2, min_requests=8, stability_percentage=0.001, max_trials=3, retries=0
        ),
        layout=RunLayout(tmp_path, "unstable").create(),
        static={},
    ).iloc[0]
    assert row["status"] == "unstable" and row["shared_memory"] == "system" and registered() == []

    regions = [shm.SHM_DIR / f"tbench_test_{name}" for name in ("input_0_0", "theirs")]  # as perf_analyzer makes one
    fds = [os.open(region, os.O_CREAT | os.O_RDWR, 0o600) for region in regions]
    try:
        with grpcclient.InferenceServerClient(served_small.endpoints.grpc_url) as client:
            for fd, region, name in zip(fds, regions, ("input_0_0", "theirs")):
                os.ftruncate(fd, 1024)
                client.register_system_shared_memory(name, "/" + region.name, 1024)
        # named after our tensors: released; another client's region on the same server: left alone
        assert release_shared_memory(served_small.endpoints.grpc_url, "system", ["input", "output"]) == ["input_0_0"]
        assert registered() == ["theirs"] and not regions[0].exists() and regions[1].exists()
        assert release_shared_memory(served_small.endpoints.grpc_url, "system") == ["theirs"] and registered() == []
    finally:
        for fd, region in zip(fds, regions):
            os.close(fd)
            region.unlink(missing_ok=True)


def test_a_remote_run_leaves_the_shared_servers_own_model_of_that_name_alone(
    prefect_harness, small_artifacts, small_adapter, tmp_path
):
    """Someone else's server already serves a `resnet50` of its own: a remote-mode run loads, measures and unloads
    models under names of its own beside it; theirs stays loaded, configured as it was and unmeasured, and a run whose
    name the server already has is refused rather than replacing it."""
    import tritonclient.grpc as grpcclient
    from conftest import run_flow

    write_repository(tmp_path / "their_repo", ServingConfig("resnet50", 4, [4], 777, 1), small_artifacts[0])
    theirs = EmbeddedServer(tmp_path / "their_repo", tmp_path / "their.log")
    theirs.start()
    try:
        ep = theirs.endpoints
        run, results, report = run_flow(
            tmp_path,
            BenchmarkRequest(
                model="resnet50",
                size="small",
                formats=["onnx"],
                output=str(tmp_path),
                server="remote",
                server_url=f"{ep.grpc_url},{ep.http_url}",
                batch_sizes=[1, 2],
                concurrency=[2],
                measurement=Measurement(window_s=0.5, stability_percentage=50, max_trials=8),
            ),
        )
        suffix = json.loads((run / "request.json").read_text())["triton_suffix"]
        ours = "resnet50" + suffix
        assert re.fullmatch(r"__tb[0-9a-f]{8}", suffix) and (run / "model_repository" / ours / "config.pbtxt").is_file()
        assert (results["status"] == "ok").all() and sorted(zip(results["scenario"], results["batch_size"])) == [
            ("offline", 1),
            ("offline", 2),
            ("online", 1),
        ]
        assert set(results["model"]) == {"resnet50"} and suffix not in report  # what is shown: the plain name
        client = grpcclient.InferenceServerClient(ep.grpc_url)
        # ours: unloaded at the end; theirs: still served, with its own config (not our offline reload's) and no
        # request of ours (perf_analyzer and the accuracy check measured our model only)
        assert not client.is_model_ready(ours) and client.is_model_ready("resnet50")
        config = client.get_model_config("resnet50").config
        assert config.max_batch_size == 4 and config.dynamic_batching.max_queue_delay_microseconds == 777
        assert client.get_inference_statistics("resnet50").model_stats[0].inference_count == 0
        assert infer_triton(client, "resnet50", small_adapter.io_spec(), small_adapter.sample_batch(2))[
            "output__0"
        ].shape == (2, 10)
        server_log = (tmp_path / "their.log").read_text()
        assert f"successfully loaded '{ours}'" in server_log and f"successfully unloaded '{ours}'" in server_log
        assert "successfully unloaded 'resnet50'" not in server_log
        # a name the server already has is refused before anything is loaded, in one line
        taken = RemoteServer(
            tmp_path / "their_repo", tmp_path / "taken.log", http_url=ep.http_url, grpc_url=ep.grpc_url
        )
        with pytest.raises(
            ServerStartError, match="already has a model named resnet50; tbench loads only names of its own"
        ) as err:
            taken.start()
        assert "\n" not in str(err.value) and taken.loaded == []
        with pytest.raises(ServerStartError, match="resnet50 was not loaded by this run"):
            taken.load("resnet50")  # e.g. an offline reload: only a model this run loaded
        assert (
            client.is_model_ready("resnet50")
            and "successfully unloaded 'resnet50'" not in (tmp_path / "their.log").read_text()
        )
        client.close()
    finally:
        theirs.stop()


def test_region_files_a_killed_perf_analyzer_never_registered_are_removed():
    """Killed between creating a region and registering it, perf_analyzer leaves a file no process maps: the sweep
    removes those named after its tensors; a mapped one, and another name, stay."""
    import mmap

    from tbench.stages.sweep import remove_unregistered_regions

    names = ["tbench_probe_out", "tbench_probe_out_0_1", "tbench_probe_mapped", "tbench_other"]
    paths = [shm.SHM_DIR / n for n in names]
    for path in paths:
        path.write_bytes(b"\0" * 4096)
    with open(paths[2], "r+b") as f, mmap.mmap(f.fileno(), 4096):
        try:
            removed = remove_unregistered_regions(["tbench_probe_out", "tbench_probe_mapped"])
            assert sorted(removed) == ["tbench_probe_out", "tbench_probe_out_0_1"]
            assert [p.exists() for p in paths] == [False, False, True, True]
        finally:
            for path in paths:
                path.unlink(missing_ok=True)
