"""Which device served a model: the results' gpu label names a GPU only when that GPU ran the model, and its metrics are
read from that GPU only. Golden inputs: a 4-GPU node's nvidia-smi query and Triton metrics page."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import GOLDEN

from tbench.node.hardware import Hardware, parse_gpu_query
from tbench.triton.monitor import ENERGY_TOTAL, parse_gpu_metrics
from tbench.triton.serving import (
    CPU_LABEL,
    DEVICE_MARK,
    REMOTE_LABEL,
    ServedOn,
    combined,
    confirmed,
    device_reports,
    pinned_env,
    served_on,
)

A100 = "NVIDIA A100-SXM4-80GB"
NODE = Hardware(
    cpu_model="AMD EPYC 7742 64-Core Processor",
    cpu_cores=256,
    memory_gib=2015.5,
    os="Linux",
    hostname="dgx-1",
    **parse_gpu_query((GOLDEN / "nvidia_smi" / "query_a100x4.csv").read_text()),
)
UUIDS = NODE.gpu_uuids
CPU_MACHINE = Hardware(cpu_model="Intel Xeon", cpu_cores=2, memory_gib=8.0, gpus=[], os="Linux")
PAGE = (GOLDEN / "triton" / "metrics_4gpu.txt").read_text()


def test_embedded_runtime_without_cuda_is_labelled_with_the_cpu_and_says_which_gpu_was_not_used():
    got = served_on("embedded", NODE, "onnxruntime", cuda_runtimes=set())
    assert (got.label, got.kind, got.gpu_uuids) == (CPU_LABEL, "KIND_CPU", [])
    assert "onnxruntime" in got.note and "AMD EPYC 7742" in got.note and f"GPU {A100} was not used" in got.note


def test_embedded_runtime_with_cuda_runs_on_the_locked_gpu_only():
    got = served_on("embedded", NODE, "onnxruntime", cuda_runtimes={"onnxruntime"})
    assert got == ServedOn(label=A100, kind="KIND_GPU", gpu_uuids=[UUIDS[0]])  # the device lock's GPU
    assert pinned_env("embedded", NODE) == {"CUDA_VISIBLE_DEVICES": UUIDS[0]} == pinned_env("local", NODE)


def test_a_native_backend_of_a_local_server_runs_on_the_locked_gpu():
    assert served_on("local", NODE, None).gpu_uuids == [UUIDS[0]]


@pytest.mark.parametrize(
    "gpus, serving, label",
    [
        (None, UUIDS, f"4 x {A100}"),
        ("all", UUIDS, f"4 x {A100}"),
        ("1,3", [UUIDS[1], UUIDS[3]], f"2 x {A100}"),
        (f"device={UUIDS[2]}", [UUIDS[2]], A100),
    ],
)
def test_docker_serves_on_the_gpus_the_container_gets(gpus, serving, label):
    got = served_on("docker", NODE, None, docker_gpus=gpus)
    assert (got.gpu_uuids, got.label, got.kind) == (serving, label, "KIND_GPU")
    assert pinned_env("docker", NODE) == {}  # --gpus decides


def test_docker_without_gpus_and_a_remote_server_name_no_gpu_of_this_node():
    none = served_on("docker", NODE, None, docker_gpus="none")
    assert none.label == CPU_LABEL and not none.on_gpu and "--gpus none" in none.note
    remote = served_on("remote", NODE, None)
    assert remote.label == REMOTE_LABEL and not remote.on_gpu


def test_a_cpu_machine_is_labelled_cpu_without_a_note():
    assert served_on("embedded", CPU_MACHINE, "onnxruntime") == ServedOn(label=CPU_LABEL)
    assert pinned_env("embedded", CPU_MACHINE) == {}


def test_the_serving_gpu_decides_which_series_of_the_metrics_page_are_read():
    embedded = served_on("embedded", NODE, "torchscript", cuda_runtimes={"torchscript"})
    assert parse_gpu_metrics(PAGE, embedded.gpu_uuids) == {
        "gpu_util_pct": 12.0,
        "gpu_mem_mb": 42000.0,
        "gpu_power_w": 96.317,
        ENERGY_TOTAL: 41783.912,
    }
    docker = served_on("docker", NODE, None, docker_gpus="1,3")
    assert parse_gpu_metrics(PAGE, docker.gpu_uuids) == pytest.approx(
        {"gpu_util_pct": 90.0, "gpu_mem_mb": 4096.0, "gpu_power_w": 600.25, ENERGY_TOTAL: 118902.377 + 109334.6}
    )
    assert parse_gpu_metrics(PAGE, served_on("embedded", NODE, "onnxruntime").gpu_uuids) == {}  # on the CPU


LOG = f"""I1123 10:00:01.000 1 server.cc:674] +----------+---------+--------+
{DEVICE_MARK}{{"model": "resnet50", "instance": "resnet50_0_0", "runtime": "onnxruntime", "device": "cuda:0"}}
{DEVICE_MARK}{{"model": "resnet50", "instance": "resnet50_0_1", "runtime": "onnxruntime", "device": "cpu"}}
{DEVICE_MARK}not json
{DEVICE_MARK}{{"model": "widedeep", "instance": "widedeep_0_0", "runtime": "tensorflow", "device": "cuda:0"}}
"""


def test_the_python_backend_reports_are_read_from_the_server_log():
    reports = device_reports(LOG)
    assert [r["device"] for r in reports["resnet50"]] == ["cuda:0", "cpu"] and len(reports["widedeep"]) == 1


def test_a_model_planned_on_the_gpu_that_reports_the_cpu_is_labelled_with_the_cpu():
    planned = served_on("embedded", NODE, "onnxruntime", cuda_runtimes={"onnxruntime"})
    got = confirmed(planned, device_reports(LOG)["resnet50"], NODE)
    assert got.label == CPU_LABEL and got.gpu_uuids == [] and "1 of 2 instances report onnxruntime" in got.note
    assert confirmed(planned, device_reports(LOG)["widedeep"], NODE) == planned
    assert confirmed(planned, [], NODE) == planned  # nothing reported (a native backend): the plan stands


def test_an_ensemble_names_the_gpu_only_with_the_parts_that_ran_elsewhere():
    gpu = ServedOn(label=A100, kind="KIND_GPU", gpu_uuids=[UUIDS[0]])
    cpu = served_on("embedded", NODE, "tensorflow")
    assert combined({"sparse": gpu, "dense": gpu}) == gpu
    mixed = combined({"sparse": cpu, "dense": gpu})
    assert mixed.label == A100 and mixed.gpu_uuids == [UUIDS[0]] and mixed.note.endswith("sparse on CPU")
    assert combined({"sparse": cpu, "dense": cpu}).label == CPU_LABEL


def test_the_flow_plans_and_confirms_per_triton_model(monkeypatch, tmp_path):
    """planning/plan.py: python-backend models on the GPU only where their runtime has CUDA; then the log decides."""
    import tbench.planning.doctor
    from tbench.core.enums import Format
    from tbench.planning.plan import confirm_devices, placement_for, plan_devices, server_options
    from tbench.request.benchmark import BenchmarkRequest

    monkeypatch.setattr(tbench.planning.doctor, "cuda_runtimes", lambda runtimes: {"onnxruntime"} & set(runtimes))
    req = BenchmarkRequest(model="resnet50", server="embedded")
    devices = plan_devices(req, NODE, {"resnet50": (Format.ONNX, False), "resnet50_ts": (Format.TS_TRACE, False)})
    assert devices["resnet50"].gpu_uuids == [UUIDS[0]] and devices["resnet50_ts"].label == CPU_LABEL
    log = tmp_path / "tritonserver.log"
    log.write_text(LOG)
    checked = confirm_devices(devices, types.SimpleNamespace(log_path=log), NODE)
    assert checked["resnet50"].label == CPU_LABEL  # one instance fell back to the CPU
    # besides the run's CPU sets (tbench.node.placement), which depend on the cores this process may use
    placed = {"placement": placement_for(req)}
    assert server_options(req, NODE) == {"gpu_env": {"CUDA_VISIBLE_DEVICES": UUIDS[0]}, **placed}
    assert server_options(req, CPU_MACHINE) == placed == server_options(req)


def _tiny_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_model_py_reports_the_device_its_runtime_got(tmp_path, monkeypatch):
    """The python backend's model.py on a KIND_GPU instance, here where onnxruntime has no CUDA: it falls back to the
    CPU, says so, and the run labels the model with the CPU."""
    from tbench.triton.repository import RUNTIME_MODEL

    fake = types.SimpleNamespace(triton_string_to_numpy=lambda t: {"TYPE_FP32": np.float32}[t])
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    namespace: dict = {}
    exec(compile(RUNTIME_MODEL.read_text(), str(RUNTIME_MODEL), "exec"), namespace)
    (tmp_path / "1").mkdir()
    _tiny_onnx(tmp_path / "1" / "model.onnx")
    config = {
        "parameters": {"runtime": {"string_value": "onnxruntime"}, "model_file": {"string_value": "model.onnx"}},
        "input": [{"name": "x", "data_type": "TYPE_FP32"}],
        "output": [{"name": "y", "data_type": "TYPE_FP32"}],
    }
    args = {
        "model_config": json.dumps(config),
        "model_repository": str(tmp_path),
        "model_version": "1",
        "model_instance_kind": "GPU",
        "model_instance_device_id": "0",
        "model_name": "resnet50",
        "model_instance_name": "resnet50_0_0",
    }
    out = io.StringIO()
    model = namespace["TritonPythonModel"]()
    with contextlib.redirect_stdout(out):
        model.initialize(args)
    reports = device_reports(out.getvalue())["resnet50"]
    assert reports == [{"model": "resnet50", "instance": "resnet50_0_0", "runtime": "onnxruntime", "device": "cpu"}]
    # its idle intra-op threads sleep: spinning ones made a small model's runs bimodal (model.py)
    session = model.session.get_session_options()
    assert session.get_session_config_entry(namespace["SPINNING"]) == "0"
    planned = served_on("embedded", NODE, "onnxruntime", cuda_runtimes={"onnxruntime"})
    assert confirmed(planned, reports, NODE).label == CPU_LABEL


def test_the_report_says_where_each_format_ran():
    from tbench.results.report import served_on_rows

    cpu = served_on("embedded", NODE, "onnxruntime")
    rows = served_on_rows({"onnx": cpu.model_dump(), "trt": served_on("local", NODE, None).model_dump()})
    assert rows == [("Served on (onnx)", f"CPU: {cpu.note}"), ("Served on (trt)", A100)]
