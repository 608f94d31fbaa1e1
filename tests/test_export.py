"""Conversions: planned over the registry, cached by content, each with its log and reproduce script."""

import copy
import json
import subprocess
import sys

import pytest

from tbench.core.enums import Format, Precision
from tbench.core.errors import ConfigError, ConversionError, Unavailable
from tbench.core.runtimes import source_digest
from tbench.stages.converters.registry import REGISTRY, ConversionOptions, Converter
from tbench.stages.converters.tensorrt import CalibrationData, CalibrationSet, engine_profile
from tbench.stages.correctness import check_artifacts
from tbench.stages.export import ConversionUnavailable, cache_key, export_model, plan, run_step


def test_chains_are_planned_over_the_registry():
    assert [(c.source, c.target) for c in plan("pytorch", Format.ONNX)] == [("pytorch", Format.ONNX)]
    assert [(c.source, c.target) for c in plan("pytorch", Format.TRT)] == [
        ("pytorch", Format.ONNX),
        ("onnx", Format.TRT),
    ]
    with pytest.raises(ConversionError, match="no conversion from pytorch to tf-savedmodel"):
        plan("pytorch", Format.TF_SAVEDMODEL)


def test_second_identical_conversion_comes_from_the_cache(small_adapter, small_module, tmp_path, monkeypatch):
    monkeypatch.setenv("TBENCH_CACHE_DIR", str(tmp_path / "cache"))  # other tests fill the session's cache
    digest = source_digest("pytorch", small_module)
    first = export_model(small_adapter, small_module, Format.TS_SCRIPT, tmp_path / "a", digest)
    again = export_model(small_adapter, small_module, Format.TS_SCRIPT, tmp_path / "b", digest)
    assert not first.cached and again.cached
    assert open(first.path, "rb").read() == open(again.path, "rb").read()
    opset16 = export_model(
        small_adapter, small_module, Format.ONNX, tmp_path / "c", digest, ConversionOptions(onnx_opset=16)
    )
    opset14 = export_model(
        small_adapter, small_module, Format.ONNX, tmp_path / "d", digest, ConversionOptions(onnx_opset=14)
    )
    assert not opset16.cached and not opset14.cached  # different options, different key
    (result,) = check_artifacts(small_adapter, small_module, [first], atol=1e-4, rtol=1e-4)
    assert result.passed  # ts-script serves the same answers


def test_each_step_leaves_a_log_and_a_script_that_reproduces_it(small_adapter, small_module, tmp_path):
    artifact = export_model(
        small_adapter,
        small_module,
        Format.ONNX,
        tmp_path,
        source_digest("pytorch", small_module),
        ConversionOptions(onnx_opset=15),
    )
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
    with pytest.raises(
        ConversionUnavailable, match="needs tensorrt, which is not installed here.*GPU node with TensorRT"
    ) as err:
        export_model(small_adapter, small_module, Format.TRT, tmp_path, source_digest("pytorch", small_module))
    assert isinstance(err.value, Unavailable)  # the kind of a runtime not here (core/trt_runtime.py)
    assert (tmp_path / "onnx" / "model.onnx").exists()  # the chain got as far as it could


def test_tensorrt_engine_builds_on_a_gpu_node(small_adapter, small_module, tmp_path):
    pytest.importorskip("tensorrt", reason="TensorRT conversion needs a GPU node with the tensorrt package")
    artifact = export_model(
        small_adapter,
        small_module,
        Format.TRT,
        tmp_path,
        source_digest("pytorch", small_module),
        ConversionOptions(max_batch_size=8),
    )
    assert artifact.path.endswith("model.plan") and (tmp_path / "trt" / "model.plan").stat().st_size > 0
    record = json.loads((tmp_path / "trt" / "conversion.json").read_text())
    assert record["profile"]["inputs"][0]["opt"][0] == 4 and "calibration" not in record
    (result,) = check_artifacts(small_adapter, small_module, [artifact], atol=1e-3, rtol=1e-3)
    assert result.passed  # TensorRT's own runtime answers like the framework


def test_int8_engine_is_calibrated_on_a_stated_set_on_a_gpu_node(small_adapter, small_module, tmp_path):
    pytest.importorskip("tensorrt", reason="TensorRT conversion needs a GPU node with the tensorrt package")
    options = ConversionOptions(precision=Precision.INT8, max_batch_size=8, opt_batch_size=4, calibration_samples=18)
    digest = source_digest("pytorch", small_module)
    artifact = export_model(small_adapter, small_module, Format.TRT, tmp_path, digest, options)
    record = json.loads((tmp_path / "trt" / "conversion.json").read_text())
    assert record["calibration"] == {
        "requested_samples": 18,
        "samples": 16,
        "batches": 4,
        "batch_size": 4,
        "remainder_dropped": 2,
        "source": "synthetic data (seed 99)",
    }
    assert "calibration: 16 samples in 4 batches of 4" in (tmp_path / "trt" / "convert.log").read_text()
    (result,) = check_artifacts(small_adapter, small_module, [artifact], atol=5e-2, rtol=5e-2)
    assert result.batch_size == 4


def _engine_step(record: dict, seen: dict) -> Converter:
    """A stand-in TensorRT builder (no TensorRT here): takes the calibration data, returns its record."""

    def build(source, out, spec, options, sample, data=None):
        seen["data"] = data
        out.write_bytes(b"plan")
        return record

    return Converter("onnx", Format.TRT, build, tools=("numpy",), builds_engine=True)


def test_an_engine_step_records_its_profile_and_calibration(small_adapter, tmp_path, monkeypatch):
    monkeypatch.setenv("TBENCH_CACHE_DIR", str(tmp_path / "cache"))
    spec = small_adapter.io_spec()
    options = ConversionOptions(precision=Precision.INT8, max_batch_size=8, opt_batch_size=4, calibration_samples=10)
    profile = engine_profile(spec, options, small_adapter.sample_batch(2))
    calibration = CalibrationSet(spec, options, profile, CalibrationData(small_adapter))
    batches = list(calibration)
    assert [b["input__0"].shape for b in batches] == [(4, 3, 32, 32)] * 2  # 10 samples: 2 batches of 4, 2 dropped
    record = {"profile": profile.model_dump(), "calibration": calibration.record()}
    assert record["calibration"] == {
        "requested_samples": 10,
        "samples": 8,
        "batches": 2,
        "batch_size": 4,
        "remainder_dropped": 2,
        "source": "synthetic data (seed 99)",
    }
    seen = {}
    onnx_file = tmp_path / "in.onnx"  # the stand-in builder reads nothing
    out, _, cached = run_step(small_adapter, _engine_step(record, seen), onnx_file, "digest", tmp_path, options)
    assert not cached and isinstance(seen["data"], CalibrationData)
    assert json.loads((out.parent / "conversion.json").read_text()) == record
    log = (out.parent / "convert.log").read_text()
    assert "profile input__0: min 1x3x32x32, opt 4x3x32x32, max 8x3x32x32" in log
    assert (
        "calibration: 8 samples in 2 batches of 4 (of 10 asked; 2 short of a batch dropped) from synthetic data" in log
    )
    assert "data=CalibrationData(adapter)" in (out.parent / "reproduce.py").read_text()
    again, _, cached = run_step(small_adapter, _engine_step(record, {}), onnx_file, "digest", tmp_path / "b", options)
    assert cached and (again.parent / "conversion.json").exists()  # the record comes with the cached plan


def test_a_calibration_set_smaller_than_one_batch_is_refused(small_adapter):
    spec = small_adapter.io_spec()
    options = ConversionOptions(precision=Precision.INT8, max_batch_size=8, opt_batch_size=4, calibration_samples=3)
    profile = engine_profile(spec, options, small_adapter.sample_batch(2))
    with pytest.raises(ConfigError, match="a calibration set of 3 samples is less than one calibration batch \\(4"):
        CalibrationSet(spec, options, profile, CalibrationData(small_adapter))


def test_engine_fields_key_only_the_steps_that_build_engines(small_adapter):
    spec, versions = small_adapter.io_spec(), {"x": "1"}
    onnx_step, engine_step = REGISTRY[("pytorch", Format.ONNX)], _engine_step({}, {})
    base = ConversionOptions(max_batch_size=8)
    shaped = base.model_copy(update={"opt_batch_size": 2, "calibration_samples": 64})
    assert cache_key("d", onnx_step, base, versions, spec) == cache_key("d", onnx_step, shaped, versions, spec)
    assert cache_key("d", engine_step, base, versions, spec) != cache_key("d", engine_step, shaped, versions, spec)
    fp16 = base.model_copy(update={"precision": Precision.FP16})
    more = fp16.model_copy(update={"calibration_samples": 1024})
    assert cache_key("d", engine_step, fp16, versions, spec) == cache_key("d", engine_step, more, versions, spec)
    int8 = base.model_copy(update={"precision": Precision.INT8})
    assert cache_key("d", engine_step, int8, versions, spec) != cache_key(
        "d", engine_step, int8.model_copy(update={"calibration_samples": 1024}), versions, spec
    )


def test_conversion_options_come_from_the_run():
    from tbench.request.benchmark import BenchmarkRequest

    req = BenchmarkRequest(
        model="resnet50", batch_sizes=[1, 2, 4, 8, 16], max_batch_size=16, calibration_samples=256
    ).resolve(has_gpu=False)
    options = ConversionOptions.for_run(req)
    assert (options.max_batch_size, options.opt_batch_size, options.calibration_samples) == (16, 8, 256)
    assert options.trt_shapes == {}
    searched = ConversionOptions.for_run(req, Precision.FP16, max_batch_size=4)
    assert (searched.precision, searched.max_batch_size, searched.opt_batch_size) == (Precision.FP16, 4, 2)


@pytest.fixture(scope="module")
def tf_small():
    import model_adapters

    adapter = model_adapters.get("resnet50", "small", framework="tensorflow")
    return adapter, adapter.build()


def test_tensorflow_chain_to_onnx_goes_through_the_savedmodel(tf_small, tmp_path, monkeypatch):
    monkeypatch.setenv("TBENCH_CACHE_DIR", str(tmp_path / "cache"))  # a real conversion, whatever ran before
    adapter, model = tf_small
    assert [(c.source, c.target) for c in plan("tensorflow", Format.ONNX)] == [
        ("tensorflow", Format.TF_SAVEDMODEL),
        ("tf-savedmodel", Format.ONNX),
    ]
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
    with pytest.raises(
        ConversionUnavailable, match="tf-savedmodel -> tf-trt needs tensorrt.*TensorFlow is built with TensorRT"
    ):
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


def test_a_copy_that_fails_on_a_full_disk_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    import errno
    import shutil

    from tbench.core.errors import StorageError
    from tbench.stages.export import copy_tree

    source = tmp_path / "cached"
    source.mkdir()
    for name in ("model.onnx", "reproduce.py"):
        (source / name).write_text("x")

    def full(src, dst, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", full)  # what copytree's copy2 writes each file with
    with pytest.raises(StorageError) as err:
        copy_tree(source, tmp_path / "run" / "onnx")
    line = str(err.value)
    assert "\n" not in line and "(2 files failed): [Errno 28] No space left on device: free some space" in line
