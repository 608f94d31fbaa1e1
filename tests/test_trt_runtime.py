"""TensorRT plans in TensorRT's own runtime (core/trt_runtime.py): chunking and profile checks on golden inputs here;
the engine itself, built at FP32/FP16/INT8 and checked against ONNX Runtime, on a GPU node with TensorRT."""

import sys

import numpy as np
import pytest

from tbench.core.enums import Format
from tbench.core.errors import ConfigError, RuntimeUnavailable, Unavailable
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.core.runtimes import run_file
from tbench.core.trt_runtime import batch_chunks, check_in_profile, import_tensorrt, require_cuda, run_chunked


@pytest.mark.parametrize(
    "n, max_batch, sizes",
    [
        (10, 4, [4, 4, 2]),
        (8, 4, [4, 4]),
        (3, 8, [3]),
        (1, 1, [1]),
        (0, 4, [0]),
    ],
)
def test_a_batch_is_split_into_chunks_of_at_most_the_profile_max(n, max_batch, sizes):
    chunks = batch_chunks(n, max_batch)
    assert [s.stop - s.start for s in chunks] == sizes and chunks[0].start == 0 and chunks[-1].stop == n
    assert all(a.stop == b.start for a, b in zip(chunks, chunks[1:]))


def test_chunked_outputs_are_joined_in_order():
    seen = []

    def run(inputs):
        seen.append(len(inputs["x"]))
        return {"y": inputs["x"] * 2, "z": inputs["x"][:, :1] + inputs["k"]}

    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    out = run_chunked(run, {"x": x, "k": np.ones((10, 1), np.float32)}, max_batch=4)
    assert seen == [4, 4, 2]
    np.testing.assert_array_equal(out["y"], x * 2)
    np.testing.assert_array_equal(out["z"], x[:, :1] + 1)
    single = run_chunked(run, {"x": x[:3], "k": np.ones((3, 1), np.float32)}, max_batch=4)
    np.testing.assert_array_equal(single["y"], x[:3] * 2)  # one chunk: its outputs as they are


def test_a_shape_outside_the_profile_is_one_line():
    check_in_profile("ids", (4, 128), (1, 16), (8, 512))
    message = (
        r"input ids of shape 4x600 is outside the TensorRT engine's profile \(1x16 to 8x512\); "
        r"rebuild it with --trt-shape ids:MIN,OPT,MAX covering it$"
    )
    with pytest.raises(ConfigError, match=message):
        check_in_profile("ids", (4, 600), (1, 16), (8, 512))
    with pytest.raises(ConfigError, match="outside"):
        check_in_profile("ids", (4,), (1, 16), (8, 512))


def test_without_tensorrt_a_plan_says_where_to_run(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    with pytest.raises(RuntimeUnavailable) as err:
        import_tensorrt()
    assert isinstance(err.value, Unavailable) and "\n" not in str(err.value)
    assert str(err.value).startswith("running a TensorRT plan needs tensorrt, which is not installed here")
    assert str(err.value).endswith("run it on a GPU node with TensorRT (e.g. the NGC Triton image)")
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"not a plan")
    spec = IoSpec(
        inputs=[TensorSpec(name="x", dtype="float32", shape=[2])],
        outputs=[TensorSpec(name="y", dtype="float32", shape=[2])],
    )
    with pytest.raises(RuntimeUnavailable, match="needs tensorrt"):
        run_file(Format.TRT, str(plan), spec, {"x": np.zeros((1, 2), np.float32)})


def test_without_a_gpu_a_plan_says_where_to_run(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        RuntimeUnavailable,
        match="running a TensorRT plan needs a CUDA GPU, and torch .* sees none "
        "here; run it on a GPU node with TensorRT",
    ):
        require_cuda()


def test_the_correctness_stage_reports_an_unavailable_runtime_as_it_is(
    monkeypatch, small_adapter, small_module, tmp_path
):
    from tbench.core.artifacts import ModelArtifact
    from tbench.core.enums import Precision
    from tbench.stages.correctness import check_artifacts

    monkeypatch.setitem(sys.modules, "tensorrt", None)
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"x")
    artifact = ModelArtifact(
        format=Format.TRT,
        precision=Precision.FP32,
        path=str(plan),
        io_spec=small_adapter.io_spec(),
        source_hash="x",
        seconds=0.0,
    )
    with pytest.raises(RuntimeUnavailable, match="^running a TensorRT plan needs tensorrt"):
        check_artifacts(small_adapter, small_module, [artifact], atol=1e-3, rtol=1e-3)


# -- on a GPU node with TensorRT ---------------------------------------------------------------------------------

SEQ = IoSpec(
    inputs=[TensorSpec(name="x", dtype="float32", shape=[-1, 8])],
    outputs=[TensorSpec(name="y", dtype="float32", shape=[4])],
)


def _tiny_onnx(tmp_path):
    """A small model over a dynamic sequence dim: Linear -> ReLU -> mean over the sequence -> Linear."""
    import torch

    from tbench.stages.converters.pytorch import pytorch_to_onnx
    from tbench.stages.converters.registry import ConversionOptions

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)).mean(dim=1))

    torch.manual_seed(0)
    path = tmp_path / "model.onnx"
    sample = {"x": np.random.default_rng(0).standard_normal((2, 12, 8)).astype(np.float32)}
    pytorch_to_onnx(Tiny().eval(), path, SEQ, ConversionOptions(), sample)
    return path, sample


def _data(n, batch):
    rng = np.random.default_rng(1)
    for start in range(0, n, batch):
        yield {"x": rng.standard_normal((min(batch, n - start), 12, 8)).astype(np.float32)}


@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-3), ("fp16", 1e-2), ("int8", 1e-1)])
def test_a_built_engine_matches_onnx_runtime(tmp_path, precision, tolerance):
    pytest.importorskip("tensorrt", reason="running TensorRT plans needs a GPU node with the tensorrt package")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("running TensorRT plans needs a CUDA GPU")
    import json

    from tbench.core.enums import Precision
    from tbench.stages.converters.registry import ConversionOptions
    from tbench.stages.converters.tensorrt import onnx_to_tensorrt
    from tbench.stages.correctness import compare

    onnx_path, sample = _tiny_onnx(tmp_path)
    options = ConversionOptions(
        precision=Precision.parse(precision),
        max_batch_size=8,
        opt_batch_size=4,
        trt_shapes={"x": [[4, 8], [12, 8], [32, 8]]},
        calibration_samples=64,
    )
    plan = tmp_path / "model.plan"
    record = onnx_to_tensorrt(onnx_path, plan, SEQ, options, sample, data=_data)
    assert record["profile"]["inputs"][0] == {"name": "x", "min": [1, 4, 8], "opt": [4, 12, 8], "max": [8, 32, 8]}
    if precision == "int8":
        assert record["calibration"] == {
            "requested_samples": 64,
            "samples": 64,
            "batches": 16,
            "batch_size": 4,
            "remainder_dropped": 0,
            "source": "given",
        }
    json.dumps(record)
    rng = np.random.default_rng(2)
    for batch, seq in ((3, 12), (20, 7), (8, 32)):  # 20 > the profile's max 8: run in chunks of 8, 8 and 4
        inputs = {"x": rng.standard_normal((batch, seq, 8)).astype(np.float32)}
        reference = run_file(Format.ONNX, str(onnx_path), SEQ, inputs)
        got = run_file(Format.TRT, str(plan), SEQ, inputs)
        assert got["y"].shape == (batch, 4) and got["y"].dtype == np.float32
        assert all(o.passed for o in compare(reference, got, tolerance, tolerance)), (batch, seq)
    with pytest.raises(ConfigError, match="outside the TensorRT engine's profile"):
        run_file(Format.TRT, str(plan), SEQ, {"x": np.zeros((2, 40, 8), np.float32)})
