"""Conversions: planned over the registry, cached by content, each with its log and reproduce script."""

import subprocess
import sys

import pytest

from tasks.correctness import check_artifacts
from tasks.export import ConversionOptions, ConversionUnavailable, export_model, plan, state_hash
from tbench.enums import Format
from tbench.errors import ConversionError


def test_chains_are_planned_over_the_registry():
    assert [(c.source, c.target) for c in plan("pytorch", Format.ONNX)] == [("pytorch", Format.ONNX)]
    assert [(c.source, c.target) for c in plan("pytorch", Format.TRT)] == [("pytorch", Format.ONNX), ("onnx", Format.TRT)]
    with pytest.raises(ConversionError, match="no conversion from pytorch to tf-savedmodel"):
        plan("pytorch", Format.TF_SAVEDMODEL)


def test_second_identical_conversion_comes_from_the_cache(small_adapter, small_module, tmp_path):
    digest = state_hash(small_module)
    first = export_model(small_adapter, small_module, Format.TS_SCRIPT, tmp_path / "a", digest)
    again = export_model(small_adapter, small_module, Format.TS_SCRIPT, tmp_path / "b", digest)
    assert not first.cached and again.cached
    assert open(first.path, "rb").read() == open(again.path, "rb").read()
    opset16 = export_model(small_adapter, small_module, Format.ONNX, tmp_path / "c", digest, ConversionOptions(onnx_opset=16))
    opset14 = export_model(small_adapter, small_module, Format.ONNX, tmp_path / "d", digest, ConversionOptions(onnx_opset=14))
    assert not opset16.cached and not opset14.cached  # different options, different key
    (result,) = check_artifacts(small_adapter, small_module, [first], atol=1e-4, rtol=1e-4)
    assert result.passed  # ts-script serves the same answers


def test_each_step_leaves_a_log_and_a_script_that_reproduces_it(small_adapter, small_module, tmp_path):
    artifact = export_model(small_adapter, small_module, Format.ONNX, tmp_path, state_hash(small_module),
                            ConversionOptions(onnx_opset=15))
    step_dir = tmp_path / "onnx"
    log = (step_dir / "convert.log").read_text()
    assert "pytorch -> onnx" in log and "torch" in log and '"onnx_opset":15' in log
    original = open(artifact.path, "rb").read()
    (step_dir / "model.onnx").unlink()
    subprocess.run([sys.executable, str(step_dir / "reproduce.py")], check=True, capture_output=True)
    import onnx

    assert onnx.load(artifact.path).opset_import[0].version == 15
    assert len(open(artifact.path, "rb").read()) == len(original)


def test_tensorrt_says_what_is_missing_here(small_adapter, small_module, tmp_path):
    try:
        import tensorrt  # noqa: F401
        pytest.skip("TensorRT is installed here: the real conversion test runs instead")
    except ImportError:
        pass
    with pytest.raises(ConversionUnavailable, match="needs tensorrt, which is not installed here.*GPU node with TensorRT"):
        export_model(small_adapter, small_module, Format.TRT, tmp_path, state_hash(small_module))
    assert (tmp_path / "onnx" / "model.onnx").exists()  # the chain got as far as it could


def test_tensorrt_engine_builds_on_a_gpu_node(small_adapter, small_module, tmp_path):
    pytest.importorskip("tensorrt", reason="TensorRT conversion needs a GPU node with the tensorrt package")
    artifact = export_model(small_adapter, small_module, Format.TRT, tmp_path, state_hash(small_module),
                            ConversionOptions(max_batch_size=8))
    assert artifact.path.endswith("model.plan") and (tmp_path / "trt" / "model.plan").stat().st_size > 0
