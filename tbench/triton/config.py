"""Triton model configuration for every platform, built through Triton's own schema (model_config_pb2).

`model_config()` covers the native platforms and the python-backend runtime model; `ensemble_config()` chains
models with tensor mapping (as the DLRM/DCNv2 guide deploys them). `validate()` refuses, before any server starts,
what Triton would refuse at load time.
"""

from __future__ import annotations

from typing import Literal

from google.protobuf import text_format
from pydantic import BaseModel, Field
from tritonclient.grpc import model_config_pb2 as mc

from tbench.core.enums import Format
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec

PYTHON_BACKEND = "python"
ENSEMBLE = "ensemble"

# serving format -> Triton platform, and the backend directory a server needs to run it natively
PLATFORMS = {
    Format.ONNX: "onnxruntime_onnx",
    Format.TS_TRACE: "pytorch_libtorch",
    Format.TS_SCRIPT: "pytorch_libtorch",
    Format.PT2: "torch_aoti",  # Triton 26.03 on: the PyTorch backend loads an AOTInductor package
    Format.TF_SAVEDMODEL: "tensorflow_savedmodel",
    Format.TF_TRT: "tensorflow_savedmodel",
    Format.TRT: "tensorrt_plan",
}
BACKEND_DIRS = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "torch_aoti": "pytorch",
    "tensorflow_savedmodel": "tensorflow",
    "tensorrt_plan": "tensorrt",
}
# Triton's default file name per platform, inside <model>/<version>/
MODEL_FILENAMES = {
    "onnxruntime_onnx": "model.onnx",
    "pytorch_libtorch": "model.pt",
    "torch_aoti": "model.pt2",
    "tensorflow_savedmodel": "model.savedmodel",
    "tensorrt_plan": "model.plan",
}
# which accelerators each platform's backend understands (Triton's optimization docs)
GPU_ACCELERATORS = {
    "onnxruntime_onnx": {"tensorrt", "cuda"},
    "tensorflow_savedmodel": {"tensorrt", "auto_mixed_precision", "gpu_io"},
}
CPU_ACCELERATORS = {"onnxruntime_onnx": {"openvino"}, "tensorflow_savedmodel": {"openvino"}}
PRECISION_MODES = {"FP32", "FP16", "INT8"}


class DynamicBatching(BaseModel):
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    max_queue_delay_us: int = Field(0, ge=0)


class InstanceGroup(BaseModel):
    count: int = 1
    kind: Literal["KIND_CPU", "KIND_GPU", "KIND_AUTO"] = "KIND_CPU"
    gpus: list[int] = Field(default_factory=list)


class Accelerator(BaseModel):
    """An execution accelerator: `tensorrt` (precision_mode, max_workspace_size_bytes...), `auto_mixed_precision`,
    `openvino` (the only CPU one)."""

    name: str
    parameters: dict[str, str] = Field(default_factory=dict)

    @property
    def on_cpu(self) -> bool:
        return self.name == "openvino"


class Warmup(BaseModel):
    batch_size: int = Field(1, ge=1)
    data: Literal["zero", "random"] = "zero"
    count: int = Field(1, ge=1)


class VersionPolicy(BaseModel):
    latest: int | None = None  # keep the newest N versions
    all: bool = False
    specific: list[int] = Field(default_factory=list)


class ModelConfigSpec(BaseModel):
    """Everything a generated config.pbtxt says, as plain data."""

    name: str
    io: IoSpec
    max_batch_size: int = Field(0, ge=0)  # 0: the model does not batch
    dynamic_batching: DynamicBatching | None = None
    instance_groups: list[InstanceGroup] = Field(default_factory=lambda: [InstanceGroup()])
    accelerators: list[Accelerator] = Field(default_factory=list)
    cuda_graphs: bool = False
    warmup: Warmup | None = None
    response_cache: bool = False
    version_policy: VersionPolicy | None = None
    reshape: dict[str, list[int]] = Field(default_factory=dict)  # tensor name -> shape the model sees
    parameters: dict[str, str] = Field(default_factory=dict)


class EnsembleStep(BaseModel):
    model_name: str
    model_version: int = -1  # the newest
    input_map: dict[str, str]  # the step model's input -> ensemble tensor
    output_map: dict[str, str]  # the step model's output -> ensemble tensor


def _dtype(t: TensorSpec) -> int:
    return mc.TYPE_STRING if t.triton_dtype == "BYTES" else mc.DataType.Value("TYPE_" + t.triton_dtype)


def served_dims(t: TensorSpec) -> list[int]:
    """Triton's dims of a tensor: a tensor whose only axis is the batch (a classifier's labels) has none, which Triton
    refuses; it is served as [1] and reshaped to [] for the model (Triton's documented way)."""
    return t.shape or [1]


def _add_tensors(config: mc.ModelConfig, io: IoSpec, reshape: dict[str, list[int]]) -> None:
    for field, tensors in ((config.input, io.inputs), (config.output, io.outputs)):
        for t in tensors:
            tensor = field.add(name=t.name, data_type=_dtype(t), dims=served_dims(t))
            if t.name in reshape or not t.shape:
                tensor.reshape.SetInParent()  # present even when the shape is [] (the message, not its list)
                tensor.reshape.shape.extend(reshape.get(t.name, []))


def model_config(spec: ModelConfigSpec, fmt: Format | None = None) -> mc.ModelConfig:
    """A native config for `fmt`, or a python-backend one (the runtime model) when `fmt` is None."""
    config = mc.ModelConfig(name=spec.name, max_batch_size=spec.max_batch_size)
    if fmt is None:
        config.backend = PYTHON_BACKEND
    else:
        config.platform = PLATFORMS[fmt]
    _add_tensors(config, spec.io, spec.reshape)
    if spec.dynamic_batching is not None:
        config.dynamic_batching.preferred_batch_size.extend(spec.dynamic_batching.preferred_batch_sizes)
        config.dynamic_batching.max_queue_delay_microseconds = spec.dynamic_batching.max_queue_delay_us
    for group in spec.instance_groups:
        config.instance_group.add(count=group.count, kind=mc.ModelInstanceGroup.Kind.Value(group.kind), gpus=group.gpus)
    accelerators = config.optimization.execution_accelerators
    for acc in spec.accelerators:
        added = (accelerators.cpu_execution_accelerator if acc.on_cpu else accelerators.gpu_execution_accelerator).add(
            name=acc.name
        )
        for key, value in acc.parameters.items():
            added.parameters[key] = value
    if spec.cuda_graphs:
        config.optimization.cuda.graphs = True
    if spec.warmup is not None:
        warm = config.model_warmup.add(
            name=f"{spec.warmup.data}_batch_{spec.warmup.batch_size}",
            batch_size=spec.warmup.batch_size,
            count=spec.warmup.count,
        )
        for t in spec.io.inputs:
            data = warm.inputs[t.name]
            data.data_type = _dtype(t)
            data.dims.extend(max(d, 1) for d in served_dims(t))  # a dynamic dimension warms up at size 1
            if spec.warmup.data == "random":
                data.random_data = True
            else:
                data.zero_data = True
    if spec.response_cache:
        config.response_cache.enable = True
    if spec.version_policy is not None:
        vp = spec.version_policy
        if vp.all:
            config.version_policy.all.SetInParent()
        elif vp.specific:
            config.version_policy.specific.versions.extend(vp.specific)
        elif vp.latest:
            config.version_policy.latest.num_versions = vp.latest
    for key, value in spec.parameters.items():
        config.parameters[key].string_value = value
    validate(config)
    return config


def ensemble_config(name: str, max_batch_size: int, io: IoSpec, steps: list[EnsembleStep]) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, platform=ENSEMBLE, max_batch_size=max_batch_size)
    _add_tensors(config, io, {})
    for step in steps:
        added = config.ensemble_scheduling.step.add(model_name=step.model_name, model_version=step.model_version)
        for key, value in step.input_map.items():
            added.input_map[key] = value
        for key, value in step.output_map.items():
            added.output_map[key] = value
    validate(config)
    return config


def validate(config: mc.ModelConfig) -> None:
    """What Triton would refuse at load time, refused here with one line."""
    where = f"model {config.name!r}"
    mbs = config.max_batch_size
    if mbs < 0:
        raise ConfigError(f"{where}: max_batch_size must be >= 0, got {mbs}")
    if config.HasField("dynamic_batching"):
        if mbs == 0:
            raise ConfigError(f"{where}: dynamic batching needs max_batch_size > 0")
        for b in config.dynamic_batching.preferred_batch_size:
            if b > mbs:
                raise ConfigError(f"{where}: preferred batch size {b} is above max_batch_size {mbs}")
    names = [t.name for t in list(config.input) + list(config.output)]
    if len(names) != len(set(names)):
        raise ConfigError(f"{where}: duplicate tensor names in {names}")
    for group in config.instance_group:
        if group.count < 1:
            raise ConfigError(f"{where}: instance count must be >= 1, got {group.count}")
        if group.gpus and group.kind != mc.ModelInstanceGroup.KIND_GPU:
            raise ConfigError(f"{where}: an instance group with gpus must be KIND_GPU")
    platform = config.platform or config.backend
    accelerators = config.optimization.execution_accelerators
    for kind, allowed, given in (
        ("GPU", GPU_ACCELERATORS, accelerators.gpu_execution_accelerator),
        ("CPU", CPU_ACCELERATORS, accelerators.cpu_execution_accelerator),
    ):
        for acc in given:
            if acc.name not in allowed.get(platform, set()):
                raise ConfigError(f"{where}: {platform} has no {kind} accelerator {acc.name!r}")
            mode = acc.parameters.get("precision_mode")
            if mode is not None and mode not in PRECISION_MODES:
                raise ConfigError(f"{where}: precision_mode {mode!r} is not one of {sorted(PRECISION_MODES)}")
    if config.optimization.cuda.graphs and platform != "tensorrt_plan":
        raise ConfigError(f"{where}: CUDA graphs are a TensorRT backend option, not {platform}'s")
    if config.platform == ENSEMBLE:
        _validate_ensemble(config, where)


def _validate_ensemble(config: mc.ModelConfig, where: str) -> None:
    if not config.ensemble_scheduling.step:
        raise ConfigError(f"{where}: an ensemble needs at least one step")
    available = {t.name for t in config.input}
    for step in config.ensemble_scheduling.step:
        missing = [t for t in step.input_map.values() if t not in available]
        if missing:
            raise ConfigError(
                f"{where}: step {step.model_name!r} reads {missing[0]!r}, which no input or earlier step provides"
            )
        available |= set(step.output_map.values())
    unproduced = [t.name for t in config.output if t.name not in available]
    if unproduced:
        raise ConfigError(f"{where}: ensemble output {unproduced[0]!r} is produced by no step")


def to_pbtxt(config: mc.ModelConfig) -> str:
    return text_format.MessageToString(config)


def parse_pbtxt(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())
