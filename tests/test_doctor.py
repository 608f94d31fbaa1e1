"""`tbench doctor`'s checks on made-up machines (its seams replaced), one real run here, and the refusals preflight
makes of a run that needs what the node lacks."""

from __future__ import annotations

import json
import types

import pytest
from conftest import GOLDEN
from typer.testing import CliRunner

from tbench.cli import app
from tbench.core.errors import ConfigError
from tbench.node.hardware import Hardware, parse_gpu_query
from tbench.planning import doctor
from tbench.planning.doctor import Check, NodeReport, missing_for
from tbench.planning.preflight import preflight
from tbench.request.benchmark import BenchmarkRequest

GPU_NODE = Hardware(
    cpu_model="AMD EPYC 7742",
    cpu_cores=256,
    memory_gib=2015.5,
    os="Linux",
    cuda="12.4",
    **parse_gpu_query((GOLDEN / "nvidia_smi" / "query_a100x4.csv").read_text()),
)
CPU_NODE = Hardware(cpu_model="Intel Xeon", cpu_cores=2, memory_gib=8.0, gpus=[], os="Linux")


def converter(source: str, target: str):
    from tbench.core.enums import Format
    from tbench.stages.converters.registry import REGISTRY

    return REGISTRY[(source, Format(target))]


@pytest.fixture
def machine(monkeypatch):
    """Replace what the checks read: installed modules, commands' answers, PATH and nvidia-smi."""
    state = types.SimpleNamespace(modules={}, missing=set(), runs={}, which={}, hardware=CPU_NODE)

    def fake_import(name):
        if name in state.missing:
            raise ModuleNotFoundError(f"No module named '{name}'")
        return state.modules.get(name) or types.SimpleNamespace(__version__="1.0")

    monkeypatch.setattr(doctor, "_import", fake_import)
    monkeypatch.setattr(doctor, "_run", lambda argv, timeout=20, env=None: state.runs.get(tuple(argv[:2]), (0, "")))
    monkeypatch.setattr(doctor, "_which", lambda name: state.which.get(name))
    monkeypatch.setattr(doctor, "_hardware", lambda: state.hardware)
    return state


def test_tensorrt_missing_says_where_to_get_it(machine):
    machine.missing.add("tensorrt")
    check = doctor.converter_check(converter("onnx", "trt"))
    assert check.ok is False and "tensorrt is not importable (ModuleNotFoundError" in check.detail
    assert check.hint == "run it on a GPU node with TensorRT (e.g. the NGC Triton image)"
    assert check.data["tools"][0] == {
        "name": "tensorrt",
        "ok": False,
        "version": None,
        "error": "ModuleNotFoundError: No module named 'tensorrt'",
    }


def test_tensorrt_builds_engines_on_a_gpu_only(machine):
    machine.modules["tensorrt"] = types.SimpleNamespace(__version__="10.5.0")
    assert "engines are built on a GPU" in doctor.converter_check(converter("onnx", "trt")).detail
    machine.hardware = GPU_NODE
    check = doctor.converter_check(converter("onnx", "trt"))
    assert check.ok and check.detail == "tensorrt 10.5.0"


def test_tf_trt_needs_a_tensorflow_built_with_tensorrt(machine):
    machine.hardware = GPU_NODE
    build = {"is_tensorrt_build": False}
    machine.modules["tensorflow"] = types.SimpleNamespace(
        __version__="2.17.0", sysconfig=types.SimpleNamespace(get_build_info=lambda: build)
    )
    check = doctor.converter_check(converter("tf-savedmodel", "tf-trt"))
    assert check.ok is False and "not built with TensorRT" in check.detail and "NGC's TensorFlow image" in check.hint
    build["is_tensorrt_build"] = True
    assert doctor.converter_check(converter("tf-savedmodel", "tf-trt")).ok


def test_docker_cli_daemon_and_image(machine):
    assert doctor.docker_check().detail == "no docker CLI on PATH"
    machine.which["docker"] = "/usr/bin/docker"
    machine.runs[("docker", "info")] = (
        1,
        "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?",
    )
    down = doctor.docker_check()
    assert down.ok is False and down.detail.startswith("the Docker daemon is not reachable: Cannot connect")
    machine.runs[("docker", "info")] = (0, "27.3.1")
    machine.runs[("docker", "image")] = (1, "Error: No such image")
    up = doctor.docker_check("nvcr.io/nvidia/tritonserver:24.10-py3")
    assert up.ok and "not pulled yet" in up.detail
    assert up.hint.startswith("docker pull nvcr.io/nvidia/tritonserver:24.10")


def test_local_server_binary_and_its_backends(machine, tmp_path, monkeypatch):
    assert doctor.local_check().ok is False
    machine.which["tritonserver"] = "/opt/tritonserver/bin/tritonserver"
    for backend in ("python", "onnxruntime", "tensorrt"):
        (tmp_path / backend).mkdir()
        (tmp_path / backend / f"libtriton_{backend}.so").write_text("")
    monkeypatch.setenv("TRITON_SERVER_VERSION", "2.51.0")
    check = doctor.local_check(backend_dir=str(tmp_path))
    assert check.ok and "(Triton 2.51.0)" in check.detail
    assert check.data["backends"] == ["onnxruntime", "python", "tensorrt"]


def test_gpus_from_nvidia_smi_and_cuda_in_each_framework(machine):
    machine.hardware = GPU_NODE
    gpus = doctor.gpus_check()
    assert gpus.ok and gpus.data["uuids"] == GPU_NODE.gpu_uuids and "driver 550.90.07, CUDA 12.4" in gpus.detail
    machine.modules["torch"] = types.SimpleNamespace(__version__="2.5.0+cpu", version=types.SimpleNamespace(cuda=None))
    assert "built without CUDA" in doctor.cuda_check("torch").detail
    machine.modules["onnxruntime"] = types.SimpleNamespace(
        __version__="1.19.2", get_available_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    assert doctor.cuda_check("onnxruntime").ok
    assert doctor.cuda_runtimes(["onnxruntime", "torchscript"]) == {"onnxruntime"}
    machine.hardware = CPU_NODE  # a CUDA build of onnxruntime lists its provider with no GPU to run it on
    assert not doctor.cuda_check("onnxruntime").ok and doctor.gpus_check().ok is False


def report(*checks: Check) -> NodeReport:
    return NodeReport(host="node", checks=list(checks))


def test_missing_for_names_what_is_missing_and_where_to_get_it():
    trt = Check(
        area="export",
        name="onnx -> trt",
        ok=False,
        detail="tensorrt is not importable",
        hint="run it on a GPU node with TensorRT (e.g. the NGC Triton image)",
    )
    docker = Check(
        area="serve",
        name="docker",
        ok=False,
        detail="the Docker daemon is not reachable: refused",
        hint="start dockerd",
    )
    gpus = Check(area="measure", name="GPUs", ok=False, detail="none: no nvidia-smi on PATH")
    got = missing_for(
        BenchmarkRequest(formats=["onnx", "trt"], server="docker", profile="gpu"), report(trt, docker, gpus)
    )
    assert got == [
        "trt: onnx -> trt cannot run here: tensorrt is not importable; run it on a GPU node with TensorRT "
        "(e.g. the NGC Triton image)",
        "--server docker: the Docker daemon is not reachable: refused; start dockerd",
        "the gpu profile needs a GPU, and this node has none: no nvidia-smi on PATH; use --profile cpu, "
        "or run on a GPU node",
    ]
    # a remote server's GPUs are not this node's; a format is refused only when no converter to it can run here
    assert missing_for(BenchmarkRequest(server="remote", server_url="h:1", profile="gpu"), report(gpus)) == []
    tf2onnx = Check(area="export", name="tf-savedmodel -> onnx", ok=False, detail="tf2onnx is not importable")
    torch = Check(area="export", name="pytorch -> onnx", ok=True)
    assert missing_for(BenchmarkRequest(formats=["onnx"]), report(tf2onnx, torch)) == []
    assert missing_for(BenchmarkRequest(formats=["onnx"], framework="tensorflow"), report(tf2onnx, torch)) != []


def test_report_for_checks_only_what_the_request_needs(machine):
    plain = doctor.report_for(BenchmarkRequest(model="resnet50", formats=["onnx"], framework="pytorch"))
    assert [c.name for c in plain.checks] == ["pytorch -> onnx", "embedded"]
    machine.which["docker"] = "/usr/bin/docker"
    gpu = doctor.report_for(BenchmarkRequest(formats=["onnx", "trt"], framework="pytorch", server="docker"))
    assert [c.name for c in gpu.checks] == ["pytorch -> onnx", "onnx -> trt", "docker", "GPUs"]


def test_preflight_refuses_in_one_line(tmp_path, machine):
    machine.missing.add("tensorrt")
    with pytest.raises(
        ConfigError,
        match=r"^this node cannot run the request: trt: onnx -> trt cannot run here: "
        r"tensorrt is not importable .*GPU node with TensorRT",
    ):
        preflight(BenchmarkRequest(model="resnet50", formats=["onnx", "trt"], output=str(tmp_path)))
    machine.runs[("docker", "info")] = (1, "Cannot connect to the Docker daemon")
    machine.which["docker"] = "/usr/bin/docker"
    with pytest.raises(
        ConfigError,
        match="^this node cannot run the request: --server docker: the Docker daemon is not reachable: Cannot connect",
    ):
        preflight(BenchmarkRequest(model="resnet50", server="docker", output=str(tmp_path)))
    preflight(BenchmarkRequest(model="resnet50", output=str(tmp_path)))  # a CPU run: nothing missing


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "resnet50", "--formats", "onnx,trt"], "error: this node cannot run the request: trt: onnx -> trt"),
        (
            ["run", "resnet50", "--profile", "gpu"],
            "error: this node cannot run the request: the gpu profile needs a GPU",
        ),
    ],
)
def test_the_cli_refuses_what_this_node_lacks(args, message, tmp_path):
    """Real checks of this machine (no GPU, no TensorRT), before anything starts."""
    result = CliRunner().invoke(app, [*args, "-o", str(tmp_path)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(message), result.output


def test_doctor_runs_here_and_says_there_is_no_gpu():
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    got = NodeReport.model_validate(json.loads(result.output[result.output.index("{") :]))
    checks = {c.name: c for c in got.checks}
    assert checks["GPUs"].ok is False and checks["onnx -> trt"].ok is False and checks["embedded"].ok
    assert checks["perf_analyzer"].ok and checks["remote"].ok is None
    assert {"pytorch -> onnx", "local", "docker", "GPU metrics", "CUDA in torch"} <= set(checks)


def test_an_ensembles_parts_formats_are_what_it_needs(machine):
    """dlrm's gpu profile exports its dense part to trt: refused where TensorRT is missing, like a requested format."""
    machine.missing.add("tensorrt")
    machine.hardware = GPU_NODE
    req = BenchmarkRequest(model="dlrm", size="tiny", profile="gpu").resolve(has_gpu=True)
    got = missing_for(req, doctor.report_for(req))
    assert len(got) == 1 and got[0].startswith("trt: onnx -> trt cannot run here: tensorrt is not importable")


def test_the_image_check_names_each_runtime_without_cuda(machine, tmp_path):
    machine.hardware = GPU_NODE
    machine.modules["tensorrt"] = types.SimpleNamespace(__version__="10.5.0")
    machine.modules["torch"] = types.SimpleNamespace(__version__="2.13.0", version=types.SimpleNamespace(cuda="12.8"))
    machine.modules["onnxruntime"] = types.SimpleNamespace(
        __version__="1.19.2", get_available_providers=lambda: ["CPUExecutionProvider"]
    )
    machine.modules["tensorflow"] = types.SimpleNamespace(
        __version__="2.19.1", test=types.SimpleNamespace(is_built_with_cuda=lambda: True)
    )
    machine.runs[("ldconfig", "-p")] = (0, f"\tlibnvinfer.so.10 (libc6,x86-64) => {tmp_path}/libnvinfer.so.10")
    (tmp_path / "libnvinfer.so.10.4.0").write_text("")
    (tmp_path / "libnvinfer.so.10").symlink_to(tmp_path / "libnvinfer.so.10.4.0")
    local = Check(area="serve", name="local", ok=True, data={"backends": ["onnxruntime", "python", "tensorrt"]})
    trt = doctor.converter_check(converter("onnx", "trt"))
    assert doctor.image_problems(report(trt, local)) == [
        "tensorrt 10.5.0 (pip) differs from the image's TensorRT 10.4.0: engines it builds would not load in Triton's "
        "tensorrt backend",
        "onnxruntime is a build without CUDA",
        "local server: no pytorch, tensorflow backend",
    ]
