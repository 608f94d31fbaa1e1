"""The run plan (tbench/planning/run_plan.py): the serving decisions and the results' labels of a run, made once from
the request, the hardware and the server's backends; no server, no export."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Format, Precision, Scenario
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.loadgen.perf_analyzer import PerfInputs
from tbench.node.hardware import Hardware
from tbench.planning.run_plan import Exported, PartExport, RunPlan
from tbench.request.benchmark import BenchmarkRequest
from tbench.triton.repository import backend_label

CPU = Hardware(cpu_model="Intel Xeon", cpu_cores=4, memory_gib=8.0, gpus=[], os="Linux")
SPEC = IoSpec(
    inputs=[TensorSpec(name="input_ids", dtype="int64", shape=[-1])],
    outputs=[TensorSpec(name="logits", dtype="float32", shape=[2])],
)


def artifact(fmt: Format, spec: IoSpec = SPEC) -> ModelArtifact:
    return ModelArtifact(
        format=fmt, precision=Precision.FP32, path=f"/m/{fmt.value}", io_spec=spec, source_hash=fmt.value, seconds=0.1
    )


def plan(**fields) -> RunPlan:
    req = BenchmarkRequest(model="resnet50", size="small", **fields).resolve(has_gpu=False)
    return RunPlan(req, CPU)


def test_each_served_format_is_one_triton_model_labelled_once(tmp_path):
    run = plan(formats=["onnx", "ts-trace"], serve_formats=["onnx", "ts-trace"], scenarios=["offline", "online"])
    exported = Exported(module=None, artifacts=[artifact(Format.ONNX), artifact(Format.TS_TRACE)])
    serving = run.serving(exported, backends={"python"})  # no native backend: both through the python runtime
    assert set(serving.models) == {run.req.triton_name(Format.ONNX), run.req.triton_name(Format.TS_TRACE)}
    assert serving.served_by == {f.value: backend_label(f, False) for f in (Format.ONNX, Format.TS_TRACE)}
    assert [is_native for _, _, is_native in serving.configs] == [False, False]
    inputs = PerfInputs(shapes={"input_ids": [128]})
    measured = serving.measured(SPEC, inputs, given_samples=None)
    assert [m.format for m in measured] == [Format.ONNX, Format.TS_TRACE]
    for m in measured:
        assert m.name == run.req.triton_name(m.format) and m.behind == [m.name]
        assert m.labels["format"] == m.format.value and m.labels["backend"] == serving.served_by[m.format.value]
        assert m.labels["gpu"] == m.device.label and m.labels["model"] == "resnet50"
        assert "128" in m.labels["shapes"]  # the measured shape is in the point's labels (compare keys on it)
        assert m.batching(Scenario.OFFLINE)["batching"] != m.batching(Scenario.ONLINE)["batching"]


def test_a_native_backend_serves_its_format_natively():
    run = plan(formats=["onnx"])
    serving = run.serving(Exported(None, [artifact(Format.ONNX)]), backends={"python", "onnxruntime"})
    assert serving.native[Format.ONNX] is True
    assert serving.served_by[Format.ONNX.value] == backend_label(Format.ONNX, True)


def test_an_ensemble_is_measured_over_its_composing_models():
    run = plan(formats=["onnx"])
    parts = [
        PartExport(SimpleNamespace(part=SimpleNamespace(name=name)), [Format.ONNX], Path(name))
        for name in ("sparse", "dense")
    ]
    exported = Exported(None, [], parts, [[artifact(Format.ONNX)], [artifact(Format.ONNX)]])
    serving = run.serving(exported, backends={"python"})
    names = [run.req.part_name("sparse"), run.req.part_name("dense")]
    assert [n for n, _ in serving.composing] == names and set(serving.models) == set(names)
    assert serving.served_by[Format.ENSEMBLE.value].startswith("ensemble of ")
    (ensemble,) = serving.measured(SPEC, PerfInputs(), given_samples=None)
    assert ensemble.format is Format.ENSEMBLE and ensemble.behind == names
    assert ensemble.labels["model_format"].startswith(Format.ENSEMBLE.label)


def test_the_plan_carries_what_the_stages_take():
    run = plan(tolerance_atol=0.5, tolerance_rtol=0.25)
    assert run.tolerances == (0.5, 0.25)
    # a CPU machine: system shared memory, no GPU; strings (their sizes vary per request) go over gRPC
    assert run.shared_memory(SPEC) == "system" and run.gpu_env == {}
    text = IoSpec(inputs=[TensorSpec(name="text", dtype="object", shape=[1])], outputs=SPEC.outputs)
    assert run.shared_memory(text) == "none"
    assert {p.scenario for p in run.points(Scenario.OFFLINE)} == {Scenario.OFFLINE}
