"""The python-backend runtime's tensor paths (tbench/triton/python_backend/model.py): DLPack returns what NumPy
returns, for one request and for a batch the dynamic batcher merged; the path each model took is chosen by rule,
printed for the run and worded in "Served by". The triton_python_backend_utils module exists only inside Triton's
stub (its Tensor is C++), so it is stood in for here by one that keeps the stub's contract: as_numpy, to_dlpack,
Tensor.from_dlpack taking a capsule, only C-contiguous tensors."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from tbench.stages.tensor_path import TENSOR_MARK, tensor_reports, tensor_words
from tbench.triton.repository import RUNTIME_MODEL

DTYPES = {"TYPE_FP32": np.float32, "TYPE_INT64": np.int64, "TYPE_STRING": np.object_}


class FakeTensor:
    """The stub's pb_utils.Tensor, as far as model.py uses it."""

    def __init__(self, name, value):
        self._name, self.value = name, value

    def name(self):
        return self._name

    def as_numpy(self):
        return self.value.cpu().numpy() if isinstance(self.value, torch.Tensor) else self.value

    def to_dlpack(self):
        tensor = self.value if isinstance(self.value, torch.Tensor) else torch.from_numpy(self.value)
        return torch.utils.dlpack.to_dlpack(tensor)

    @classmethod
    def from_dlpack(cls, name, capsule):
        tensor = torch.utils.dlpack.from_dlpack(capsule)
        if not tensor.is_contiguous():  # the stub's own rule
            raise RuntimeError("DLPack tensor is not contiguous")
        return cls(name, tensor)


class FakeResponse:
    def __init__(self, output_tensors, error=None):
        self.output_tensors, self.error = output_tensors, error


def fake_pb_utils():
    return types.SimpleNamespace(
        Tensor=FakeTensor,
        InferenceResponse=FakeResponse,
        TritonError=RuntimeError,
        triton_string_to_numpy=DTYPES.__getitem__,
        get_input_tensor_by_name=lambda request, name: request[name],
    )


class TwoHeads(torch.nn.Module):
    """Two outputs of two dtypes, one of them cast by the config (int32 -> int64)."""

    def forward(self, x):
        return torch.relu(x) * 2.0, x.argmax(dim=1).to(torch.int32)


def _tiny_onnx(path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _config(runtime, model_file, outputs):
    params = {"runtime": {"string_value": runtime}, "model_file": {"string_value": model_file}}
    return {
        "parameters": params,
        "input": [{"name": "x", "data_type": "TYPE_FP32"}],
        "output": [{"name": n, "data_type": t} for n, t in outputs],
    }


@pytest.fixture
def runtime(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils())
    monkeypatch.delenv("TBENCH_TENSOR_PATH", raising=False)
    namespace: dict = {}
    exec(compile(RUNTIME_MODEL.read_text(), str(RUNTIME_MODEL), "exec"), namespace)
    return namespace


def _load(runtime, tmp_path, config, kind="CPU"):
    args = {
        "model_config": json.dumps(config),
        "model_repository": str(tmp_path),
        "model_version": "1",
        "model_instance_kind": kind,
        "model_instance_device_id": "0",
        "model_name": "tiny",
        "model_instance_name": "tiny_0_0",
    }
    model = runtime["TritonPythonModel"]()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        model.initialize(args)
    return model, printed.getvalue()


@pytest.fixture
def torchscript(tmp_path):
    (tmp_path / "1").mkdir(exist_ok=True)
    torch.jit.script(TwoHeads()).save(str(tmp_path / "1" / "model.pt"))
    return _config("torchscript", "model.pt", [("y", "TYPE_FP32"), ("k", "TYPE_INT64")])


@pytest.fixture
def onnx_model(tmp_path):
    (tmp_path / "1").mkdir(exist_ok=True)
    _tiny_onnx(tmp_path / "1" / "model.onnx")
    return _config("onnxruntime", "model.onnx", [("y", "TYPE_FP32")])


def _requests(*batches):
    rng = np.random.default_rng(3)
    return [{"x": FakeTensor("x", rng.standard_normal((b, 3)).astype(np.float32))} for b in batches]


def _outputs(responses):
    return [{t.name(): t.as_numpy() for t in r.output_tensors} for r in responses]


def _both_paths(runtime, tmp_path, config, requests):
    got = {}
    for path in ("numpy", "dlpack"):
        params = {**config["parameters"], "tensor_path": {"string_value": path}}
        model, _ = _load(runtime, tmp_path, {**config, "parameters": params})
        assert model.tensors.name == path
        got[path] = _outputs(model.execute(requests))
    return got


@pytest.mark.parametrize("batches", [(4,), (2, 3, 1)], ids=["one request", "a merged batch"])
@pytest.mark.parametrize("model_config", ["torchscript", "onnx_model"])
def test_dlpack_returns_what_numpy_returns(runtime, tmp_path, model_config, batches, request):
    config = request.getfixturevalue(model_config)
    got = _both_paths(runtime, tmp_path, config, _requests(*batches))
    assert len(got["dlpack"]) == len(batches)
    for numpy_out, dlpack_out in zip(got["numpy"], got["dlpack"]):
        assert numpy_out.keys() == dlpack_out.keys()
        for name, value in numpy_out.items():
            assert dlpack_out[name].dtype == value.dtype  # the config's dtype on both paths (int32 -> int64)
            np.testing.assert_array_equal(dlpack_out[name], value)


def test_the_runtime_takes_dlpack_and_says_so(runtime, tmp_path, torchscript, onnx_model):
    model, printed = _load(runtime, tmp_path, torchscript)
    assert model.tensors.name == "dlpack"
    assert tensor_reports(printed)["tiny"]["path"] == "dlpack"
    outputs = model.execute(_requests(2))[0].output_tensors
    assert all(isinstance(t.value, torch.Tensor) for t in outputs)  # handed back over DLPack, not as NumPy


def test_onnx_runtime_on_the_cpu_takes_numpy_unless_dlpack_is_asked_for(runtime, tmp_path, onnx_model):
    """ONNX Runtime reads a NumPy input in place on the CPU: DLPack's IO binding saves no copy there and was slower
    (benchmarks/tensor_paths.py), and its instances need not import torch. Asked for, DLPack is still taken."""
    model, printed = _load(runtime, tmp_path, onnx_model)
    assert model.tensors.name == "numpy"
    assert tensor_reports(printed)["tiny"] == {
        "path": "numpy",
        "why": "ONNX Runtime on the CPU reads NumPy arrays in place",
    }
    choose = runtime["choose_tensor_path"]
    assert choose("onnxruntime", onnx_model, {"tensor_path": "dlpack"})[0] == "dlpack"
    # a session on the GPU keeps its tensors there
    assert choose("onnxruntime", onnx_model, {}, "cuda:0")[0] == "dlpack"


def test_numpy_where_dlpack_cannot_carry_the_tensors(runtime, monkeypatch):
    choose = runtime["choose_tensor_path"]
    config = _config("torchscript", "model.pt", [("y", "TYPE_FP32")])
    strings = {**config, "output": [{"name": "label", "data_type": "TYPE_STRING"}]}
    assert choose("torchscript", strings, {}) == ("numpy", "string tensors (label) have no DLPack form")
    assert choose("tensorflow", config, {})[0] == "numpy"
    assert choose("torchscript", config, {"tensor_path": "numpy"}) == ("numpy", "asked for")
    monkeypatch.setenv("TBENCH_TENSOR_PATH", "numpy")  # the server's environment: an A/B without a new repository
    assert choose("aoti", config, {}) == ("numpy", "asked for")
    monkeypatch.setenv("TBENCH_TENSOR_PATH", "dlpack")
    assert choose("onnxruntime", config, {}) == ("dlpack", "asked for")


def test_an_old_onnxruntime_keeps_numpy(runtime, monkeypatch):
    import onnxruntime as ort

    monkeypatch.delattr(ort.OrtValue, "from_dlpack")
    path, why = runtime["choose_tensor_path"]("onnxruntime", _config("onnxruntime", "m.onnx", []), {}, "cuda:0")
    assert path == "numpy" and "has no OrtValue.from_dlpack" in why


def test_a_string_model_is_served_through_numpy(runtime, tmp_path, torchscript):
    config = {**torchscript, "output": [{"name": "y", "data_type": "TYPE_STRING"}]}
    model, printed = _load(runtime, tmp_path, config)
    assert model.tensors.name == "numpy" and tensor_reports(printed)["tiny"]["path"] == "numpy"


def test_the_report_names_the_path_of_each_python_backend_model():
    log = "\n".join(
        [
            "I1123 server.cc:674] loading",
            TENSOR_MARK + json.dumps({"model": "m_ts_trace", "path": "dlpack", "why": "zero-copy"}),
            TENSOR_MARK + "not json",
            TENSOR_MARK + json.dumps({"model": "m_sparse", "path": "numpy", "why": "the TensorFlow runtime"}),
            TENSOR_MARK + json.dumps({"model": "m_dense", "path": "dlpack", "why": "zero-copy"}),
        ]
    )
    paths = tensor_reports(log)
    names = {"ts-trace": ["m_ts_trace"], "onnx": ["m_onnx"], "ensemble": ["m_sparse", "m_dense"]}
    worded = tensor_words(names, paths)
    assert worded["ts-trace"] == "through DLPack (zero-copy)"
    assert "onnx" not in worded  # a native backend printed nothing: no line
    assert worded["ensemble"] == "m_sparse through NumPy (the TensorFlow runtime), m_dense through DLPack (zero-copy)"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU branch needs torch with CUDA and a GPU")
def test_on_a_gpu_the_tensors_stay_on_the_device(runtime, tmp_path, torchscript):
    """A KIND_GPU instance: inputs that arrive on the GPU are run there and the outputs are handed back from there,
    never through the host."""
    model, printed = _load(runtime, tmp_path, torchscript, kind="GPU")
    assert model.device.type == "cuda" and model.tensors.name == "dlpack"
    x = torch.randn(4, 3, device="cuda")
    responses = model.execute([{"x": FakeTensor("x", x)}])
    outputs = {t.name(): t.value for t in responses[0].output_tensors}
    assert all(v.is_cuda for v in outputs.values())
    torch.testing.assert_close(outputs["y"], torch.relu(x) * 2.0)


@pytest.mark.e2e
def test_the_real_stub_returns_the_same_outputs_on_both_paths(tmp_path):
    """The real python backend's pb_utils: one TorchScript model served twice, one copy asked for NumPy; the same
    inputs (one request, and requests the batcher merges) give the same outputs, and the log says which path each
    took."""
    import tritonclient.grpc as grpcclient

    from tbench.core.artifacts import ModelArtifact
    from tbench.core.enums import Format, Precision
    from tbench.core.iospec import IoSpec, TensorSpec
    from tbench.triton.process_server import EmbeddedServer
    from tbench.triton.repository import ServingConfig, write_repository

    path = tmp_path / "model.pt"
    torch.jit.script(TwoHeads()).save(str(path))
    spec = IoSpec(
        inputs=[TensorSpec(name="x", dtype="float32", shape=[3])],
        outputs=[TensorSpec(name="y", dtype="float32", shape=[3]), TensorSpec(name="k", dtype="int64", shape=[])],
    )
    artifact = ModelArtifact(
        format=Format.TS_SCRIPT, precision=Precision.FP32, path=str(path), io_spec=spec, source_hash="x", seconds=0
    )
    repo = tmp_path / "repo"
    for name in ("tiny_dlpack", "tiny_numpy"):
        write_repository(repo, ServingConfig(name, 8, [8], 200_000, 1), artifact)
    with (repo / "tiny_numpy" / "config.pbtxt").open("a") as config:
        config.write('\nparameters { key: "tensor_path" value { string_value: "numpy" } }\n')
    inputs = [r["x"].value for r in _requests(4, 1, 2)]
    got = {}
    with EmbeddedServer(repo, tmp_path / "server.log") as server:
        client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
        for name in ("tiny_dlpack", "tiny_numpy"):
            got[name] = _infer_together(client, name, inputs)
        client.close()
    for dlpack_out, numpy_out, x in zip(got["tiny_dlpack"], got["tiny_numpy"], inputs):
        for name in ("y", "k"):
            assert dlpack_out[name].dtype == numpy_out[name].dtype
            np.testing.assert_array_equal(dlpack_out[name], numpy_out[name])
        np.testing.assert_allclose(dlpack_out["y"], np.maximum(x, 0) * 2.0)
    paths = tensor_reports((tmp_path / "server.log").read_text())
    assert paths["tiny_dlpack"]["path"] == "dlpack" and paths["tiny_numpy"] == {"path": "numpy", "why": "asked for"}


def _infer_together(client, name, inputs):
    """The inputs sent as requests in flight together (the 200 ms queue delay merges them): each one's outputs."""
    import tritonclient.grpc as grpcclient

    results = {}
    for i, x in enumerate(inputs):
        request = grpcclient.InferInput("x", list(x.shape), "FP32")
        request.set_data_from_numpy(x)
        client.async_infer(name, [request], callback=lambda result, error, i=i: results.__setitem__(i, (result, error)))
    deadline = time.monotonic() + 30
    while len(results) < len(inputs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(results) == len(inputs) and all(error is None for _, error in results.values()), results
    return [{o: results[i][0].as_numpy(o) for o in ("y", "k")} for i in range(len(inputs))]


@pytest.mark.e2e
def test_an_onnx_models_instances_on_the_cpu_do_not_load_torch(served_small):
    """The real stubs of the small model's ONNX instances: NumPy's path, and no libtorch in their memory (importing it
    costs each instance 1.4 s of CPU here: benchmarks/results/tensor_paths.json)."""
    repo = str(served_small.repository)
    stubs = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "triton_python_backend_stub" in cmdline and repo in cmdline:
                stubs.append((proc / "maps").read_text())
        except OSError:  # gone meanwhile, or not ours to read
            continue
    assert stubs, f"no stub of {repo} found"
    assert not any("libtorch" in maps for maps in stubs)
    assert tensor_reports(served_small.log_path.read_text())["resnet50"]["path"] == "numpy"
