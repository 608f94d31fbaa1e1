"""What the server can do decides the plan, in one place (tbench/triton/capabilities.py): each mode's reading of its
server's version, backends and python runtimes; the flags a server we launch gets from them; each model's serving
format re-planned before export on a server without the TensorFlow backend; one line for a format nothing serves; the
offline scenario without shared memory where the server refuses it. No server runs here (test_e2e runs them)."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from tbench.core.enums import Format, Scenario
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.core.layout import RunLayout
from tbench.loadgen.perf_analyzer import CLIENT_SHM_REFUSED, PerfInputs, Point
from tbench.node.hardware import Hardware
from tbench.node.procs import Completed
from tbench.planning.plan import serving_format
from tbench.planning.run_plan import RunPlan
from tbench.request.benchmark import PYTHON_BACKEND_RUNTIMES, BenchmarkRequest, Measurement
from tbench.triton.capabilities import (
    CLIENT_SHM_FLAG,
    CONFIG_NAME_FLAG,
    LATENCY_HISTOGRAM,
    NATIVE_SINCE,
    SAFE_TRACING,
    TORCH_AOTI,
    ServerCapabilities,
    help_options,
    image_version,
    importable_runtimes,
    ngc_release_version,
)
from tbench.triton.config import BACKEND_DIRS, PLATFORMS
from tbench.triton.process_server import NGC_IMAGE, DockerServer, EmbeddedServer, LocalServer
from tbench.triton.repository import serves_natively

GOLDEN = Path(__file__).parent / "golden" / "docker"
CPU = Hardware(cpu_model="Intel Xeon", cpu_cores=4, memory_gib=8.0, gpus=[], os="Linux")
GPU = Hardware(cpu_model="Intel Xeon", cpu_cores=16, memory_gib=64.0, gpus=["NVIDIA A100"], os="Linux")
ALL_RUNTIMES = frozenset(PYTHON_BACKEND_RUNTIMES.values())

# NGC 26.10's layout (no TensorFlow backend; NGC's python backend has no framework) and 24.10's (all of them)
NGC_26_10 = ServerCapabilities(
    "2.74.0",
    frozenset({"onnxruntime", "python", "pytorch", "tensorrt"}),
    frozenset(),
    "image tag (26.10)",
    mode="docker",
)
NGC_24_10 = ServerCapabilities(
    "2.51.0", frozenset({"onnxruntime", "python", "pytorch", "tensorflow", "tensorrt"}), frozenset(), mode="docker"
)
EMBEDDED = ServerCapabilities("2.51.0", frozenset({"python"}), ALL_RUNTIMES, "nvidia-pytriton 0.7.0", mode="embedded")


def dotted(release: tuple[int, int]) -> str:
    return ".".join(map(str, release)) + ".0"


def flag_args(caps: ServerCapabilities) -> list[str]:
    return caps.launch_args()


def helping_binary(folder: Path, help_text: str) -> str:
    """A `tritonserver` that prints `help_text` for --help, as a local server's binary does."""
    (folder / "help.txt").write_text(help_text)
    binary = folder / "tritonserver"
    binary.write_text(f"#!/bin/sh\ncat {folder / 'help.txt'}\nexit 1\n")
    binary.chmod(0o755)
    return str(binary)


# --- versions: NGC releases, image inspection, the embedded wheel, --help ---


@pytest.mark.parametrize(
    "release, version",
    [
        ("21.02", "2.7.0"),
        ("24.10", "2.51.0"),  # our perf_analyzer's release
        ("25.02", "2.55.0"),  # the last with the TensorFlow backend
        ("25.06", "2.59.0"),
        ("25.07", None),  # a patch release (2.59.1), no container
        ("25.08", "2.60.0"),
        ("26.01", "2.65.0"),
        ("26.03", "2.67.0"),
        ("26.04", "2.68.0"),
        ("26.10", "2.74.0"),
        ("20.06", None),  # before the monthly count held
        ("26.13", None),
        ("latest", None),
    ],
)
def test_an_ngc_release_names_its_triton_version(release, version):
    assert ngc_release_version(release) == version


def test_an_images_version_is_its_env_then_its_tag():
    ngc = (GOLDEN / "tritonserver_26.10-py3.inspect.json").read_text()
    assert image_version(NGC_IMAGE, ngc) == ("2.74.0", "image env TRITON_SERVER_VERSION")
    # not pulled yet (no inspect answer): the tag names the release
    assert image_version("nvcr.io/nvidia/tritonserver:24.10-py3", None) == ("2.51.0", "image tag (24.10)")
    assert image_version("nvcr.io/nvidia/tritonserver:26.04-py3-sdk") == ("2.68.0", "image tag (26.04)")
    # the image this machine builds (infra/build_cpu_image.py) names no version: unknown, so no flag of later releases
    cpu = (GOLDEN / "tbench-triton-cpu.inspect.json").read_text()
    version, source = image_version("tbench-triton-cpu:2.51-3f9c0d1e2a4b", cpu)
    assert version is None and source.startswith("unknown")
    assert image_version("x:1", "not json")[0] is None


def test_the_release_constants_hold_the_versions_the_release_notes_name():
    assert ngc_release_version("26.04") == dotted(CLIENT_SHM_FLAG)
    assert ngc_release_version("26.01") == dotted(LATENCY_HISTOGRAM)
    assert ngc_release_version("26.03") == dotted(TORCH_AOTI)
    assert ngc_release_version("24.05") == dotted(CONFIG_NAME_FLAG)
    assert NATIVE_SINCE == {"pt2": TORCH_AOTI}


def test_the_embedded_servers_capabilities_are_the_wheels_and_this_venvs(tmp_path):
    server = EmbeddedServer(tmp_path / "repo", tmp_path / "s.log")
    caps = server.capabilities()
    assert caps.version == "2.51.0" and caps.source == "nvidia-pytriton 0.7.0" and caps.mode == "embedded"
    assert caps.backends == frozenset({"python"})  # the wheel ships the python backend only
    assert "onnxruntime" in caps.python_runtimes  # its stub runs this venv, which has onnxruntime
    assert caps.python_runtimes == importable_runtimes() and server.capabilities() is caps  # read once
    # Triton 2.51 knows neither flag: an unknown option makes tritonserver exit
    assert "--allow-client-shm=true" not in server.server_args("/models", None)
    assert not any(a.startswith("--metrics-config") for a in server.server_args("/models", None))
    # nor is its tracer safe under load (Signal 11 in TraceRelease): its rate points are judged from their windows
    server._before_launch()
    assert server.trace_path is not None and server.request_trace("m") is None
    server.stop()


def test_request_traces_only_from_the_release_whose_tracer_survives_load():
    """Server PR #8144 (in 2.57.0, 25.04) fixed the crash in TraceRelease: 2.51 crashed at most traced rate points."""
    assert ngc_release_version("25.04") == dotted(SAFE_TRACING)
    assert not ServerCapabilities("2.51.0").traces_safely and not ServerCapabilities("2.56.0").traces_safely
    assert ServerCapabilities("2.57.0").traces_safely and ServerCapabilities("2.68.0").traces_safely
    assert not ServerCapabilities(None).traces_safely  # unknown: not on a chance of crashing the server


def test_python_runtimes_are_the_frameworks_this_python_finds():
    found = {"onnxruntime", "torch"}
    runtimes = importable_runtimes(lambda name: object() if name in found else None)
    assert {"onnxruntime", "torchscript"} <= runtimes and "tensorflow" not in runtimes
    assert runtimes <= ALL_RUNTIMES


def test_a_local_servers_help_says_whether_it_knows_the_client_shm_flag(tmp_path, monkeypatch):
    help_251 = (GOLDEN / "tritonserver_2.51_help.txt").read_text()
    assert "model-repository" in help_options(help_251) and "allow-client-shm" not in help_options(help_251)
    monkeypatch.delenv("TRITON_SERVER_VERSION", raising=False)
    monkeypatch.delenv("NVIDIA_TRITON_SERVER_VERSION", raising=False)
    # src/command_line_parser.cc of 2.68 on lists the option among the shared memory ones
    help_268 = (
        help_251 + "\n  --allow-client-shm <boolean>\n\tAllow clients to register/unregister and use shared memory\n"
    )
    for text, flagged in ((help_251, False), (help_268, True)):
        server = LocalServer(tmp_path / "repo", tmp_path / "s.log", binary=helping_binary(tmp_path, text))
        info = server.version_info()
        assert info.version is None and info.client_shm_flag is flagged  # the version unknown, the flag known
        assert ("--allow-client-shm=true" in server.argv()) is flagged
    monkeypatch.setenv("TRITON_SERVER_VERSION", "2.74.0")  # inside NGC's image
    server = LocalServer(tmp_path / "repo", tmp_path / "s.log", binary=helping_binary(tmp_path, help_268))
    assert server.version_info().version == "2.74.0"
    assert "--metrics-config=histogram_latencies=true" in server.argv()


def test_a_server_serves_the_offline_configs_from_its_start_where_it_knows_the_flag(tmp_path, monkeypatch):
    """--model-config-name (24.05 on): each model's configs/offline.pbtxt from the start, and the server counts those
    models as served with another config; an older server's sweep reloads them instead."""
    from tritonclient.grpc import model_config_pb2 as mc

    monkeypatch.delenv("TRITON_SERVER_VERSION", raising=False)
    monkeypatch.delenv("NVIDIA_TRITON_SERVER_VERSION", raising=False)
    help_251 = (GOLDEN / "tritonserver_2.51_help.txt").read_text()
    help_older = help_251.replace("--model-config-name", "--model-config-nom")
    assert "model-config-name" in help_options(help_251)
    static = {"m": mc.ModelConfig(name="m", max_batch_size=8)}
    for text, flagged in ((help_251, True), (help_older, False)):
        server = LocalServer(tmp_path / "repo", tmp_path / "s.log", binary=helping_binary(tmp_path, text))
        assert server.serve_from_start("offline", static) is flagged
        assert ("--model-config-name=offline" in server.argv()) is flagged
        assert server.start_configs == (static if flagged else {})
    embedded = EmbeddedServer(tmp_path / "repo", tmp_path / "e.log")  # 2.51: known from its version
    assert embedded.serve_from_start("offline", static) and "--model-config-name=offline" in embedded.server_args(
        "/m", None
    )


# --- the flags a server we launch gets ---


def test_flags_only_on_versions_that_have_them():
    assert flag_args(ServerCapabilities("2.51.0")) == []
    assert flag_args(ServerCapabilities(None)) == []  # unknown: never risk an option the server may not know
    assert flag_args(ServerCapabilities("2.65.0")) == ["--metrics-config=histogram_latencies=true"]
    assert flag_args(ServerCapabilities("2.67.0")) == ["--metrics-config=histogram_latencies=true"]
    assert flag_args(ServerCapabilities("2.68.0")) == [
        "--allow-client-shm=true",
        "--metrics-config=histogram_latencies=true",
    ]
    # what --help lists wins over the version
    assert flag_args(ServerCapabilities("2.74.0", options=frozenset({"model-repository"}))) == [
        "--metrics-config=histogram_latencies=true"
    ]


def test_the_default_docker_image_is_a_current_release_started_with_its_flags(tmp_path, monkeypatch):
    assert NGC_IMAGE == "nvcr.io/nvidia/tritonserver:26.10-py3"
    inspected = (GOLDEN / "tritonserver_26.10-py3.inspect.json").read_text()
    monkeypatch.setattr(DockerServer, "inspect", lambda self: inspected if self.image == NGC_IMAGE else None)
    current = DockerServer(tmp_path / "repo", tmp_path / "s.log", gpus=None)
    argv = current.argv()
    assert "--allow-client-shm=true" in argv and "--metrics-config=histogram_latencies=true" in argv
    assert argv.index("--allow-client-shm=true") > argv.index("tritonserver")  # the server's option, not docker's
    monkeypatch.setattr(DockerServer, "backends", lambda self: {"onnxruntime", "python", "pytorch", "tensorrt"})
    monkeypatch.setattr(DockerServer, "runtimes_argv", lambda self: ["false"])  # no python3 in the image to ask
    caps = current.capabilities()
    assert caps.version == "2.74.0" and caps.python_runtimes == frozenset()  # NGC's python backend: no framework
    assert not caps.native(Format.TF_SAVEDMODEL) and not caps.python_runs(Format.TF_SAVEDMODEL)
    older = DockerServer(tmp_path / "repo", tmp_path / "s.log", image="nvcr.io/nvidia/tritonserver:24.10-py3")
    assert not any(a.startswith(("--allow-client-shm", "--metrics-config")) for a in older.argv())
    built = DockerServer(tmp_path / "repo", tmp_path / "s.log", image="tbench-triton-cpu:2.51-3f9c0d1e2a4b")
    assert built.version_info().version is None and "--allow-client-shm=true" not in built.argv()
    monkeypatch.setattr(DockerServer, "backends", lambda self: {"python"})
    assert built.capabilities().python_runtimes == ALL_RUNTIMES  # an image of our making: our runtimes assumed


def test_an_images_python_runtimes_are_read_from_its_python(tmp_path, monkeypatch):
    """The probe an image's python3 runs (DockerServer.runtimes_argv), run here by this Python: what it prints is what
    the plan counts on, not what the image's name suggests."""
    import sys

    probe = DockerServer(tmp_path / "repo", tmp_path / "s.log", image="nvcr.io/nvidia/tritonserver:26.10-py3")
    code = probe.runtimes_argv()[-1]
    monkeypatch.setattr(DockerServer, "runtimes_argv", lambda self: [sys.executable, "-c", code])
    assert probe.python_runtimes() == importable_runtimes()  # an NGC tag, but this environment's answer wins
    monkeypatch.setattr(DockerServer, "runtimes_argv", lambda self: [sys.executable, "-c", "print()"])
    assert probe.python_runtimes() == frozenset()  # a python3 with no runtime in reach
    assert probe.side_log("runtimes") == tmp_path / "s.runtimes.log"
    checked = DockerServer(tmp_path, Path("/dev/null"), image="nvcr.io/nvidia/tritonserver:26.10-py3")
    assert checked.side_log("backends").parent == Path(tempfile.gettempdir())  # never a file in /dev


# --- the plan: formats from capabilities ---


def test_a_format_counts_as_native_only_from_the_release_that_brought_its_platform(monkeypatch):
    monkeypatch.setitem(NATIVE_SINCE, Format.ONNX.value, (2, 70))
    assert not ServerCapabilities("2.68.0", frozenset({"onnxruntime"})).native(Format.ONNX)
    assert not ServerCapabilities(None, frozenset({"onnxruntime"})).native(Format.ONNX)  # unknown: not assumed
    assert ServerCapabilities("2.70.0", frozenset({"onnxruntime"})).native(Format.ONNX)
    caps = ServerCapabilities("2.68.0", frozenset({"onnxruntime", "python"}), ALL_RUNTIMES)
    assert serves_natively(Format.ONNX, caps) is False  # before it: the python backend's runtime
    assert "serves it from Triton 2.70 on" in caps.why_not(Format.ONNX)


def test_serves_natively_takes_capabilities_or_backends():
    assert serves_natively(Format.ONNX, NGC_26_10) is True
    assert serves_natively(Format.ONNX, EMBEDDED) is False
    assert serves_natively(Format.ONNX, {"python"}) is False  # backends alone: every runtime assumed, as before
    with pytest.raises(ConfigError, match="tf-savedmodel neither natively \\(no tensorflow backend: NGC's images"):
        serves_natively(Format.TF_SAVEDMODEL, NGC_26_10)


def test_a_tensorflow_format_without_the_tensorflow_backend_is_served_as_onnx_or_tensorrt():
    fmt, why = serving_format(Format.TF_SAVEDMODEL, NGC_26_10)
    assert fmt is Format.ONNX and why.startswith("planned as tf-savedmodel, served as onnx by its onnxruntime backend")
    assert "no tensorflow backend" in why and "Triton 2.74.0" in why
    # TF-TRT's first choice is an engine, where the server has the backend and this node a GPU to build it
    assert serving_format(Format.TF_TRT, NGC_26_10, has_gpu=True)[0] is Format.TRT
    assert serving_format(Format.TF_TRT, NGC_26_10, has_gpu=False)[0] is Format.ONNX
    assert serving_format(Format.TF_SAVEDMODEL, NGC_26_10, has_gpu=True)[0] is Format.ONNX
    # a server that has it keeps it; so does one whose python backend runs TensorFlow (the embedded one)
    assert serving_format(Format.TF_SAVEDMODEL, NGC_24_10) == (Format.TF_SAVEDMODEL, "")
    assert serving_format(Format.TF_SAVEDMODEL, EMBEDDED) == (Format.TF_SAVEDMODEL, "")
    no_tf_here = replace(EMBEDDED, python_runtimes=ALL_RUNTIMES - {"tensorflow"})
    fmt, why = serving_format(Format.TF_SAVEDMODEL, no_tf_here)
    assert fmt is Format.ONNX and "python backend (onnxruntime)" in why and "environment has no tensorflow" in why


def test_a_format_nothing_serves_is_one_line_naming_the_fix():
    nothing = ServerCapabilities("2.74.0", frozenset({"python"}), frozenset(), "image tag (26.10)", mode="docker")
    with pytest.raises(ConfigError) as err:
        serving_format(Format.TS_TRACE, nothing)
    line = str(err.value)
    assert "\n" not in line and "no pytorch backend" in line and "environment has no torch" in line
    assert "--docker-image IMAGE with the pytorch backend" in line
    onnx_only = replace(NGC_26_10, backends=frozenset({"onnxruntime"}))
    with pytest.raises(ConfigError, match="or --formats onnx$"):
        serving_format(Format.TS_TRACE, onnx_only)
    with pytest.raises(ConfigError, match="--server docker or local with the tensorrt backend"):
        serving_format(Format.TRT, EMBEDDED)


def test_the_plan_re_plans_a_tensorflow_model_before_export_and_says_why():
    req = BenchmarkRequest(model="widedeep", size="small", server="docker").resolve(has_gpu=False)
    assert req.serve_formats == [Format.TF_SAVEDMODEL]
    plan = RunPlan(req, CPU).on_server(NGC_26_10)
    assert plan.req.serve_formats == [Format.ONNX] and Format.ONNX in plan.req.formats
    assert plan.capabilities is NGC_26_10 and set(plan.replanned) == {Format.ONNX.value}
    assert plan.req.triton_name(Format.ONNX) == "widedeep"  # one served format: the plain name
    kept = RunPlan(req, CPU).on_server(NGC_24_10)
    assert kept.req == req and kept.replanned == {}


def test_an_ensembles_parts_are_re_planned_the_same_way():
    req = BenchmarkRequest(model="dlrm", size="small", server="docker").resolve(has_gpu=False)
    parts = {"sparse": ["tf-savedmodel"], "dense": ["onnx"]}
    plan = RunPlan(req, CPU).on_server(NGC_26_10, parts)
    assert plan.req.serve_formats == [Format.ENSEMBLE]
    assert plan.part_formats == {"sparse": [Format.ONNX, Format.TF_SAVEDMODEL], "dense": [Format.ONNX]}
    assert list(plan.replanned_parts) == ["sparse"] and plan.replanned == {}
    kept = RunPlan(req, CPU).on_server(NGC_24_10, parts)
    assert kept.part_formats["sparse"] == [Format.TF_SAVEDMODEL] and not kept.replanned and not kept.replanned_parts


def test_what_serves_each_model_and_why_reaches_the_report_wording():
    from tbench.core.artifacts import ModelArtifact
    from tbench.core.enums import Precision
    from tbench.planning.run_plan import Exported

    req = BenchmarkRequest(model="widedeep", size="small", server="docker").resolve(has_gpu=False)
    plan = RunPlan(req, CPU).on_server(NGC_26_10)
    spec = IoSpec(inputs=[TensorSpec(name="x", dtype="float32", shape=[4])], outputs=[])
    onnx = ModelArtifact(
        format=Format.ONNX, precision=Precision.FP32, path="/m/onnx", io_spec=spec, source_hash="h", seconds=0.1
    )
    serving = plan.serving(Exported(None, [onnx]))  # on the capabilities the plan was made for
    assert serving.native == {Format.ONNX: True}
    assert serving.served_by == {"onnx": PLATFORMS[Format.ONNX]}  # the results' backend column: the backend alone
    assert serving.served_by_why["onnx"].startswith(f"{PLATFORMS[Format.ONNX]}; planned as tf-savedmodel")
    assert BACKEND_DIRS[PLATFORMS[Format.ONNX]] in NGC_26_10.backends


# --- a server that refuses client shared memory ---

REFUSED = f"{CLIENT_SHM_REFUSED}. Start the server with '--allow-client-shm=true' to enable."  # src/common.h


def test_an_offline_point_the_server_refuses_shared_memory_for_is_measured_without_it(tmp_path, monkeypatch):
    from tbench.stages import sweep

    calls = []

    def fake_run(argv, log_path, timeout, env=None):
        calls.append(argv)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if "--shared-memory" in argv:  # perf_analyzer passes on the server's answer to its registration
            log_path.write_text(f"$ {' '.join(argv)}\n*** Measurement Settings ***\nerror: {REFUSED}\n")
            return Completed(argv, 1, log_path, 0.1)
        csv = Path(argv[argv.index("-f") + 1])
        csv.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(__file__).parent / "golden" / "perf_analyzer" / "offline_b4_plain.csv", csv)
        log_path.write_text(f"$ {' '.join(argv)}\n")
        return Completed(argv, 0, log_path, 0.2)

    monkeypatch.setattr(sweep.procs, "run", fake_run)
    monkeypatch.setattr(sweep, "release_shared_memory", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "remove_unregistered_regions", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "warm_up", lambda *a, **k: {})
    monkeypatch.setattr(sweep.tools, "perf_analyzer_binary", lambda: Path("/bin/perf_analyzer"))
    monkeypatch.setattr(sweep.tools, "perf_analyzer_env", lambda: {})
    layout = RunLayout(tmp_path, "run").create()
    spec = IoSpec(
        inputs=[TensorSpec(name="x", dtype="float32", shape=[4])],
        outputs=[TensorSpec(name="y", dtype="float32", shape=[2])],
    )
    table = sweep.run_sweep(
        [Point(Scenario.OFFLINE, 4, 1), Point(Scenario.OFFLINE, 8, 1)],
        model="m",
        grpc_url="127.0.0.1:1",
        spec=spec,
        m=Measurement(window_s=0.5, order="ascending"),
        layout=layout,
        static={"model": "m"},
        inputs=PerfInputs(shared_memory="system"),
    )
    assert list(table["status"]) == ["ok", "ok"] and list(table["shared_memory"]) == ["none", "none"]
    # the first point: refused, then measured over gRPC; the second went over gRPC at once
    assert [("--shared-memory" in a) for a in calls] == [True, False, False]
    assert len(list((layout.run_dir / "logs" / "perf_analyzer").glob("*b4*.log"))) == 2  # the refused one kept
    assert sweep.refused_shared_memory(table, "system") and not sweep.refused_shared_memory(table, "none")
    assert "--allow-client-shm=true" in sweep.SHM_REFUSED_NOTE


def test_the_doctor_names_the_default_image_and_what_it_implies():
    from tbench.planning.doctor import docker_image_check

    check = docker_image_check()
    assert check.ok is None and check.detail.startswith(f"default image {NGC_IMAGE}: Triton 2.74.0")
    assert "no TensorFlow backend" in check.detail and "--allow-client-shm=true" in check.detail
    assert "--docker-image" in check.hint
    older = docker_image_check("nvcr.io/nvidia/tritonserver:24.10-py3")
    assert "TensorFlow backend (NGC <= 25.02)" in older.detail and "allow-client-shm" not in older.detail
    assert docker_image_check("tbench-triton-cpu:2.51-x").detail.endswith("a run reads its version from the image")


# --- end to end: the re-plan on a real server ---


@pytest.mark.e2e
@pytest.mark.parametrize(("model", "size"), [("widedeep", "small"), ("dlrm", "tiny")], ids=["widedeep", "dlrm"])
def test_a_tensorflow_model_is_served_as_onnx_where_the_server_cannot_run_tensorflow(
    prefect_harness, tmp_path, monkeypatch, model, size
):
    """The embedded server taken for one whose python backend has no TensorFlow (as NGC's, which has no TensorFlow
    backend either): the SavedModel (DLRM: its sparse part) is converted by tf2onnx before anything is served,
    served by the python backend's onnxruntime, and answers as the framework does."""
    import json

    from conftest import run_flow

    monkeypatch.setattr(EmbeddedServer, "python_runtimes", lambda self: importable_runtimes() - {"tensorflow"})
    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(
            model=model,
            size=size,
            batch_sizes=[64],
            max_batch_size=128,
            accuracy_samples=256,
            scenarios=["offline"],
            output=str(tmp_path),
            measurement=Measurement(window_s=0.5, stability_percentage=50),
        ),
    )
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["server_capabilities"]["version"] == "2.51.0"
    assert "tensorflow" not in manifest["server_capabilities"]["python_runtimes"]
    served = "onnx" if model == "widedeep" else "ensemble"
    assert manifest["request"]["serve_formats"] == [served]
    assert (
        "planned as tf-savedmodel, served as onnx by its python backend (onnxruntime)" in manifest["served_by"][served]
    )
    assert "python (tensorflow)" not in set(results["backend"]) and (results["status"] == "ok").any()
    accuracy = json.loads((run / "accuracy.json").read_text())[0]
    assert abs(accuracy["difference"]) < 1e-3  # the same answers through Triton
    assert "planned as tf-savedmodel, served as onnx" in report


def test_an_ensembles_dense_part_is_served_as_a_tensorrt_engine_where_one_can_be_built_and_served():
    """DLRM's dense part on a GPU, as the guides serve it: a TensorRT engine on a server with the tensorrt backend;
    ONNX, and why, where the server has no tensorrt backend or the node no GPU."""
    req = BenchmarkRequest(model="dlrm", size="small", server="docker").resolve(has_gpu=True)
    parts = {"sparse": ["tf-savedmodel"], "dense": ["trt", "onnx"]}
    engine = RunPlan(req, GPU).on_server(NGC_24_10, parts)
    assert engine.part_formats["dense"] == [Format.TRT, Format.ONNX] and "dense" not in engine.replanned_parts
    embedded = RunPlan(req, GPU).on_server(EMBEDDED, parts)
    assert embedded.part_formats["dense"] == [Format.ONNX, Format.TRT]
    assert "planned as trt, served as onnx" in embedded.replanned_parts["dense"]
    on_cpu = RunPlan(req, CPU).on_server(NGC_24_10, parts)
    assert on_cpu.part_formats["dense"][0] is Format.ONNX and "no GPU" in on_cpu.replanned_parts["dense"]
