"""Generated config.pbtxt for every platform and knob, against golden files (tests/golden/config/).

The python-backend golden is also loaded by the real embedded server in test_e2e; the native platforms need
backends this machine does not have, so their goldens are checked against Triton's schema and docs here."""

from __future__ import annotations

import pytest
from conftest import GOLDEN
from tritonclient.grpc import model_config_pb2 as mc

from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Format, Precision
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.triton.config import (
    Accelerator,
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ModelConfigSpec,
    VersionPolicy,
    Warmup,
    ensemble_config,
    model_config,
    parse_pbtxt,
    to_pbtxt,
)
from tbench.triton.process_server import EmbeddedServer, backends_in
from tbench.triton.repository import ServingConfig, serves_natively, write_repository

IMAGE = IoSpec(
    inputs=[TensorSpec(name="input__0", dtype="float32", shape=[3, 224, 224])],
    outputs=[TensorSpec(name="output__0", dtype="float32", shape=[1000])],
)
# several inputs, an integer one, a dynamic non-batch dimension: the normal case
TOKENS = IoSpec(
    inputs=[TensorSpec(name="text", dtype="int64", shape=[-1]), TensorSpec(name="pace", dtype="float32", shape=[1])],
    outputs=[
        TensorSpec(name="mel", dtype="float16", shape=[80, -1]),
        TensorSpec(name="lengths", dtype="int32", shape=[1]),
    ],
)
TRT = Accelerator(name="tensorrt", parameters={"precision_mode": "FP16", "max_workspace_size_bytes": "4294967296"})


def cases() -> dict[str, tuple[ModelConfigSpec, Format | None]]:
    return {
        "onnx_gpu_tensorrt_accelerator": (
            ModelConfigSpec(
                name="resnet50",
                io=IMAGE,
                max_batch_size=128,
                dynamic_batching=DynamicBatching(preferred_batch_sizes=[64, 128], max_queue_delay_us=1000),
                instance_groups=[InstanceGroup(count=2, kind="KIND_GPU", gpus=[0])],
                accelerators=[TRT],
                warmup=Warmup(batch_size=8, data="random"),
                response_cache=True,
                version_policy=VersionPolicy(latest=1),
            ),
            Format.ONNX,
        ),
        "onnx_cpu_openvino": (
            ModelConfigSpec(
                name="resnet50",
                io=IMAGE,
                max_batch_size=8,
                dynamic_batching=DynamicBatching(preferred_batch_sizes=[8]),
                instance_groups=[InstanceGroup(count=2)],
                accelerators=[Accelerator(name="openvino")],
            ),
            Format.ONNX,
        ),
        "torchscript_multi_io_dynamic_dims": (
            ModelConfigSpec(
                name="fastpitch",
                io=TOKENS,
                max_batch_size=8,
                dynamic_batching=DynamicBatching(preferred_batch_sizes=[4, 8], max_queue_delay_us=100),
                instance_groups=[InstanceGroup(count=1, kind="KIND_GPU")],
                warmup=Warmup(batch_size=1),
                version_policy=VersionPolicy(specific=[1, 3]),
            ),
            Format.TS_SCRIPT,
        ),
        "tf_savedmodel_amp": (
            ModelConfigSpec(
                name="widedeep",
                io=IMAGE,
                max_batch_size=131072,
                instance_groups=[InstanceGroup(kind="KIND_GPU")],
                accelerators=[Accelerator(name="auto_mixed_precision")],
                version_policy=VersionPolicy(all=True),
            ),
            Format.TF_SAVEDMODEL,
        ),
        "tf_trt_fp16": (
            ModelConfigSpec(
                name="resnet50",
                io=IMAGE,
                max_batch_size=128,
                dynamic_batching=DynamicBatching(preferred_batch_sizes=[64, 128], max_queue_delay_us=1000),
                instance_groups=[InstanceGroup(count=2, kind="KIND_GPU")],
                accelerators=[TRT],
            ),
            Format.TF_TRT,
        ),
        "tensorrt_plan_cuda_graphs": (
            ModelConfigSpec(
                name="dense",
                io=IMAGE,
                max_batch_size=65536,
                instance_groups=[InstanceGroup(kind="KIND_GPU")],
                cuda_graphs=True,
                reshape={"output__0": [1000, 1]},
            ),
            Format.TRT,
        ),
        "non_batching_model": (ModelConfigSpec(name="nnunet", io=IMAGE, max_batch_size=0), Format.TS_SCRIPT),
    }


def ensemble():
    io = IoSpec(
        inputs=[
            TensorSpec(name="numerical_features", dtype="float32", shape=[13]),
            TensorSpec(name="categorical_features", dtype="int64", shape=[26]),
        ],
        outputs=[TensorSpec(name="score", dtype="float32", shape=[1])],
    )
    return ensemble_config(
        "dlrm",
        65536,
        io,
        [
            EnsembleStep(
                model_name="dlrm_sparse",
                input_map={"input__0": "categorical_features"},
                output_map={"output__0": "embeddings"},
            ),
            EnsembleStep(
                model_name="dlrm_dense",
                input_map={"args_0": "numerical_features", "args_1": "embeddings"},
                output_map={"output_1": "score"},
            ),
        ],
    )


@pytest.mark.parametrize("case", sorted(cases()))
def test_platform_config_matches_golden(case):
    spec, fmt = cases()[case]
    text = to_pbtxt(model_config(spec, fmt))
    assert text == (GOLDEN / "config" / f"{case}.pbtxt").read_text()
    assert to_pbtxt(parse_pbtxt(text)) == text


def test_ensemble_matches_golden():
    assert to_pbtxt(ensemble()) == (GOLDEN / "config" / "ensemble_dlrm.pbtxt").read_text()


def test_knobs_land_where_triton_reads_them():
    spec, fmt = cases()["onnx_gpu_tensorrt_accelerator"]
    c = model_config(spec, fmt)
    assert c.platform == "onnxruntime_onnx" and not c.backend
    acc = c.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert acc.name == "tensorrt" and acc.parameters["precision_mode"] == "FP16"
    assert c.instance_group[0].gpus == [0] and c.response_cache.enable and c.version_policy.latest.num_versions == 1
    assert c.model_warmup[0].inputs["input__0"].random_data and c.model_warmup[0].batch_size == 8
    ts = model_config(*cases()["torchscript_multi_io_dynamic_dims"])
    assert ts.platform == "pytorch_libtorch" and list(ts.input[0].dims) == [-1]
    assert [t.data_type for t in ts.input] == [mc.TYPE_INT64, mc.TYPE_FP32]
    assert [t.data_type for t in ts.output] == [mc.TYPE_FP16, mc.TYPE_INT32] and list(ts.output[0].dims) == [80, -1]
    assert list(ts.model_warmup[0].inputs["text"].dims) == [1]  # dynamic dims warm up at size 1
    trt = model_config(*cases()["tensorrt_plan_cuda_graphs"])
    assert trt.optimization.cuda.graphs and list(trt.output[0].reshape.shape) == [1000, 1]
    assert not model_config(*cases()["non_batching_model"]).HasField("dynamic_batching")


def spec(**kw):
    return ModelConfigSpec(name="m", io=IMAGE, max_batch_size=8, **kw)


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: model_config(spec(accelerators=[TRT]), Format.TS_TRACE),
            "pytorch_libtorch has no GPU accelerator 'tensorrt'",
        ),
        (
            lambda: model_config(spec(accelerators=[Accelerator(name="auto_mixed_precision")]), Format.ONNX),
            "no GPU accelerator 'auto_mixed_precision'",
        ),
        (
            lambda: model_config(spec(accelerators=[Accelerator(name="openvino")]), Format.TRT),
            "tensorrt_plan has no CPU accelerator 'openvino'",
        ),
        (
            lambda: model_config(
                spec(accelerators=[Accelerator(name="tensorrt", parameters={"precision_mode": "FP8"})]), Format.ONNX
            ),
            "precision_mode 'FP8'",
        ),
        (lambda: model_config(spec(cuda_graphs=True), Format.ONNX), "CUDA graphs are a TensorRT backend option"),
        (
            lambda: model_config(
                ModelConfigSpec(name="m", io=IMAGE, max_batch_size=0, dynamic_batching=DynamicBatching()), Format.ONNX
            ),
            "dynamic batching needs max_batch_size > 0",
        ),
        (
            lambda: model_config(spec(instance_groups=[InstanceGroup(kind="KIND_CPU", gpus=[0])]), Format.ONNX),
            "must be KIND_GPU",
        ),
        (
            lambda: ensemble_config(
                "e", 8, IMAGE, [EnsembleStep(model_name="a", input_map={"x": "nope"}, output_map={"y": "output__0"})]
            ),
            "reads 'nope'",
        ),
        (
            lambda: ensemble_config(
                "e", 8, IMAGE, [EnsembleStep(model_name="a", input_map={"x": "input__0"}, output_map={"y": "other"})]
            ),
            "output 'output__0' is produced by no step",
        ),
        (lambda: ensemble_config("e", 8, IMAGE, []), "at least one step"),
    ],
)
def test_what_triton_would_refuse_is_refused_first(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_backends_are_read_from_the_servers_backend_directory(tmp_path):
    assert EmbeddedServer(GOLDEN, GOLDEN / "unused.log").backends() == {"python"}  # the embedded server's own
    for name in ("onnxruntime", "pytorch"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"libtriton_{name}.so").touch()
    (tmp_path / "empty").mkdir()
    assert backends_in(tmp_path) == {"onnxruntime", "pytorch"}
    assert backends_in(tmp_path / "missing") == set()


def test_native_backend_when_present_else_the_python_runtime():
    assert serves_natively(Format.ONNX, {"onnxruntime", "python"})
    assert not serves_natively(Format.ONNX, {"python"})
    assert not serves_natively(Format.TS_SCRIPT, {"python", "onnxruntime"})
    with pytest.raises(ConfigError, match="neither natively \\(no tensorrt backend\\)"):
        serves_natively(Format.TRT, {"python"})


def test_native_repository_uses_tritons_default_file_names(tmp_path):
    saved = tmp_path / "export" / "saved"
    saved.mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(b"pb")
    artifact = ModelArtifact(
        format=Format.TF_SAVEDMODEL,
        precision=Precision.FP32,
        path=str(saved),
        io_spec=IMAGE,
        source_hash="x",
        seconds=0,
    )
    model_dir = write_repository(tmp_path / "repo", ServingConfig("m", 8, [8], 0, 1), artifact, native=True)
    assert (model_dir / "1" / "model.savedmodel" / "saved_model.pb").exists()
    assert parse_pbtxt((model_dir / "config.pbtxt").read_text()).platform == "tensorflow_savedmodel"


def test_backend_label_names_what_serves_the_model():
    from tbench.triton.repository import backend_label

    assert backend_label(Format.ONNX, native=True) == "onnxruntime_onnx"
    assert backend_label(Format.ONNX, native=False) == "python (onnxruntime)"
    assert backend_label(Format.TS_TRACE, native=False) == "python (torchscript)"


def test_a_tensor_whose_only_axis_is_the_batch_is_served_as_one_reshaped_to_none():
    """Triton refuses a tensor without dims ("must specify 'dims'"); its documented way is dims [1], reshape []."""
    io = IoSpec(
        inputs=[TensorSpec(name="x", dtype="float32", shape=[4]), TensorSpec(name="w", dtype="float32", shape=[])],
        outputs=[TensorSpec(name="label", dtype="int64", shape=[])],
    )
    config = model_config(ModelConfigSpec(name="m", io=io, max_batch_size=8, warmup=Warmup()))
    (x, w), (label,) = config.input, config.output
    assert list(x.dims) == [4] and not x.HasField("reshape")
    for tensor in (w, label):
        assert list(tensor.dims) == [1] and tensor.HasField("reshape") and list(tensor.reshape.shape) == []
    assert "reshape {\n  }" in to_pbtxt(config)  # written out, though empty
    assert list(config.model_warmup[0].inputs["w"].dims) == [1]
