"""Conversions: planned over the registry, cached by content, each with its log and reproduce script."""

import copy
import subprocess
import sys

import pytest

from tasks.correctness import check_artifacts
from tasks.export import ConversionOptions, ConversionUnavailable, export_model, plan
from tbench.runtimes import source_digest
from tbench.enums import Format
from tbench.errors import ConversionError


def test_chains_are_planned_over_the_registry():
    assert [(c.source, c.target) for c in plan("pytorch", Format.ONNX)] == [("pytorch", Format.ONNX)]
    assert [(c.source, c.target) for c in plan("pytorch", Format.TRT)] == [("pytorch", Format.ONNX), ("onnx", Format.TRT)]
    with pytest.raises(ConversionError, match="no conversion from pytorch to tf-savedmodel"):
        plan("pytorch", Format.TF_SAVEDMODEL)


def test_second_identical_conversion_comes_from_the_cache(small_adapter, small_module, tmp_path, monkeypatch):
    monkeypatch.setenv("TBENCH_CACHE_DIR", str(tmp_path / "cache"))  # other tests fill the session's cache
    digest = source_digest("pytorch", small_module)
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
    artifact = export_model(small_adapter, small_module, Format.ONNX, tmp_path, source_digest("pytorch", small_module),
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
        export_model(small_adapter, small_module, Format.TRT, tmp_path, source_digest("pytorch", small_module))
    assert (tmp_path / "onnx" / "model.onnx").exists()  # the chain got as far as it could


def test_tensorrt_engine_builds_on_a_gpu_node(small_adapter, small_module, tmp_path):
    pytest.importorskip("tensorrt", reason="TensorRT conversion needs a GPU node with the tensorrt package")
    artifact = export_model(small_adapter, small_module, Format.TRT, tmp_path, source_digest("pytorch", small_module),
                            ConversionOptions(max_batch_size=8))
    assert artifact.path.endswith("model.plan") and (tmp_path / "trt" / "model.plan").stat().st_size > 0


@pytest.fixture(scope="module")
def tf_small():
    import model_adapters

    adapter = model_adapters.get("resnet50", "small", framework="tensorflow")
    return adapter, adapter.build()


def test_tensorflow_chain_to_onnx_goes_through_the_savedmodel(tf_small, tmp_path, monkeypatch):
    monkeypatch.setenv("TBENCH_CACHE_DIR", str(tmp_path / "cache"))  # a real conversion, whatever ran before
    adapter, model = tf_small
    assert [(c.source, c.target) for c in plan("tensorflow", Format.ONNX)] == [
        ("tensorflow", Format.TF_SAVEDMODEL), ("tf-savedmodel", Format.ONNX)]
    digest = source_digest("tensorflow", model)
    saved, onnx_file = (export_model(adapter, model, f, tmp_path, digest) for f in (Format.TF_SAVEDMODEL, Format.ONNX))
    assert onnx_file.cached is False and (tmp_path / "onnx" / "tf2onnx.log").exists()
    import onnx

    graph = onnx.load(onnx_file.path).graph
    assert [i.name for i in graph.input] == ["input"] and [o.name for o in graph.output] == ["output"]
    results = check_artifacts(adapter, model, [saved, onnx_file], atol=1e-4, rtol=1e-4)
    assert [r.format for r in results] == [Format.TF_SAVEDMODEL, Format.ONNX] and all(r.passed for r in results)


def test_tf_trt_says_what_is_missing_here(tf_small, tmp_path):
    try:
        import tensorrt  # noqa: F401
        pytest.skip("TensorRT is installed here")
    except ImportError:
        pass
    adapter, model = tf_small
    with pytest.raises(ConversionUnavailable, match="tf-savedmodel -> tf-trt needs tensorrt.*TensorFlow is built with TensorRT"):
        export_model(adapter, model, Format.TF_TRT, tmp_path, source_digest("tensorflow", model))


def test_source_digest_follows_the_weights(tf_small, small_module):
    import torch

    _, model = tf_small
    before = source_digest("tensorflow", model), source_digest("pytorch", small_module)
    clone = copy.deepcopy(small_module)
    with torch.no_grad():
        next(clone.parameters()).add_(1.0)
    assert source_digest("pytorch", clone) != before[1] and source_digest("pytorch", small_module) == before[1]
    assert source_digest("tensorflow", model) == before[0]
