"""config.pbtxt through model_config_pb2, checked against a golden file Triton loaded (see test_e2e)."""

import pytest
from conftest import GOLDEN

from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Format, Precision
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.triton.config import parse_pbtxt, to_pbtxt, validate
from tbench.triton.repository import ServingConfig, build_config, write_offline_configs, write_repository

SPEC = IoSpec(
    inputs=[TensorSpec(name="input__0", dtype="float32", shape=[3, 32, 32])],
    outputs=[TensorSpec(name="output__0", dtype="float32", shape=[10])],
)


def artifact(fmt=Format.ONNX, path="/m/model.onnx"):
    return ModelArtifact(format=fmt, precision=Precision.FP32, path=path, io_spec=SPEC, source_hash="x", seconds=0.0)


CFG = ServingConfig(
    name="resnet50",
    max_batch_size=8,
    preferred_batch_sizes=[4, 8],
    max_queue_delay_us=2000,
    instances=2,
    intra_op_threads=1,
)


def test_config_matches_golden_pbtxt():
    assert to_pbtxt(build_config(CFG, artifact())) == (GOLDEN / "config" / "resnet50_small_onnx.pbtxt").read_text()


def test_golden_round_trips_through_the_schema():
    text = (GOLDEN / "config" / "resnet50_small_onnx.pbtxt").read_text()
    config = parse_pbtxt(text)
    assert config.backend == "python" and config.max_batch_size == 8
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.instance_group[0].count == 2
    assert config.parameters["runtime"].string_value == "onnxruntime"
    assert to_pbtxt(config) == text


def test_torchscript_artifact_selects_the_torchscript_runtime():
    config = build_config(CFG, artifact(Format.TS_TRACE, "/m/model.pt"))
    assert config.parameters["runtime"].string_value == "torchscript"
    assert config.parameters["model_file"].string_value == "model.pt"


@pytest.mark.parametrize(
    "cfg, message",
    [
        (ServingConfig("m", 4, [8], 100, 1), "preferred batch size 8 is above max_batch_size 4"),
        (ServingConfig("m", 4, [2], 100, 0), "instance count must be >= 1"),
    ],
)
def test_invalid_configs_are_refused_before_any_server_starts(cfg, message):
    with pytest.raises(ConfigError, match=message):
        build_config(cfg, artifact())


def test_non_batching_model_has_no_dynamic_batching():
    config = build_config(ServingConfig("m", 0, [], 100, 1), artifact())
    assert not config.HasField("dynamic_batching")
    validate(config)


def test_repository_layout(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"onnx")
    model_dir = write_repository(tmp_path / "repo", CFG, artifact(path=str(model)))
    assert sorted(p.name for p in (model_dir / "1").iterdir()) == ["model.onnx", "model.py"]
    assert parse_pbtxt((model_dir / "config.pbtxt").read_text()).name == "resnet50"


def test_ensemble_steps_follow_the_parts_tensor_names(tmp_path):
    """DLRM's ensemble as the flow writes it: steps derived from the parts' io specs (golden config.pbtxt)."""
    from model_adapters.dlrm import DLRM
    from tbench.triton.repository import write_ensemble

    dlrm = DLRM("tiny")
    model_dir = write_ensemble(
        tmp_path,
        "dlrm",
        2048,
        dlrm.io_spec(),
        [("dlrm_sparse", dlrm.sparse_io_spec()), ("dlrm_dense", dlrm.dense_io_spec())],
    )
    assert (model_dir / "1").is_dir() and not any((model_dir / "1").iterdir())  # Triton wants the version folder
    assert (model_dir / "config.pbtxt").read_text() == (GOLDEN / "config" / "ensemble_dlrm_tiny.pbtxt").read_text()


def test_gpu_accelerator_only_on_native_gpu_models():
    """Wide&Deep's guide serves its SavedModel with TensorFlow's automatic mixed precision on GPU instances."""
    gpu = ServingConfig("widedeep", 8, [8], 0, 2, kind="KIND_GPU", accelerator="auto_mixed_precision")
    saved = artifact(Format.TF_SAVEDMODEL, "/m/model.savedmodel")
    accelerators = build_config(gpu, saved, native=True).optimization.execution_accelerators.gpu_execution_accelerator
    assert [a.name for a in accelerators] == ["auto_mixed_precision"]
    assert not build_config(gpu, saved, native=False).HasField("optimization")  # the python runtime has no accelerators
    cpu = ServingConfig("widedeep", 8, [8], 0, 2, kind="KIND_CPU", accelerator="auto_mixed_precision")
    assert not build_config(cpu, saved, native=True).HasField("optimization")


def test_the_guides_accelerator_is_a_gpu_profile_default():
    from tbench.request.benchmark import BenchmarkRequest

    assert BenchmarkRequest(model="widedeep").resolve(has_gpu=True).accelerators == {
        "tf-savedmodel": "auto_mixed_precision"
    }
    assert BenchmarkRequest(model="widedeep").resolve(has_gpu=False).accelerators == {}


def test_tensorrt_accelerator_carries_the_precision():
    gpu = ServingConfig("resnet50", 128, [64, 128], 0, 2, kind="KIND_GPU", accelerator="tensorrt", precision="FP16")
    (acc,) = build_config(
        gpu, artifact(Format.TF_SAVEDMODEL, "/m/model.savedmodel"), native=True
    ).optimization.execution_accelerators.gpu_execution_accelerator
    assert acc.name == "tensorrt" and acc.parameters["precision_mode"] == "FP16"


def test_offline_configs_serve_static_batching_and_keep_everything_else(tmp_path):
    """The offline scenario's config: no dynamic batcher (so no queue delay), the rest as under test."""
    built = write_offline_configs(tmp_path, [(CFG, artifact(), False)])
    static, dynamic = built["resnet50"], build_config(CFG, artifact())
    assert dynamic.HasField("dynamic_batching") and not static.HasField("dynamic_batching")
    assert CFG.static().queue_delay_us == 0 and CFG.queue_delay_us == 2000
    static.ClearField("dynamic_batching")
    dynamic.ClearField("dynamic_batching")
    assert static == dynamic
    # where a server started with --model-config-name=offline finds it
    assert parse_pbtxt((tmp_path / "resnet50" / "configs" / "offline.pbtxt").read_text()) == built["resnet50"]
