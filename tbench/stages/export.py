"""Stage 1: export and convert. Converters are plain functions registered by (source, target); a chain such as
PyTorch -> ONNX -> TensorRT is planned over the registry, not hard-coded. Each step leaves its log and a reproduce
script next to its output and is cached by content: same source, same options, same tool versions -> no rerun.

Precision (what each format can hold: tbench/precision.py): the step that makes the target applies the requested
precision where it can (TensorRT's builders, TF-TRT, the TorchScript exporters); otherwise a precision step registered
as (format, format) converts the FP32 file (FP32 ONNX -> FP16 ONNX, also for other teams' files) into
`<format>-<precision>/`. Steps before the last run at FP32. The artifact's precision is what its file holds."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from model_adapters.base import ModelAdapter
from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Format, Precision
from tbench.core.errors import BenchError, ConversionError, Unavailable
from tbench.core.iospec import IoSpec
from tbench.core.registry import Registry, qualified_name
from tbench.core.trt_runtime import TRT_WHERE
from tbench.request.trt_profiles import (
    CALIBRATION_SEED,
    TrtProfile,
    calibration_batches,
    check_calibration_samples,
    default_calibration_samples,
    describe,
    opt_batch_size,
    optimisation_profile,
    shaped_inputs,
)

FILE_NAMES = {
    Format.ONNX: "model.onnx",
    Format.TS_TRACE: "model.pt",
    Format.TS_SCRIPT: "model.pt",
    Format.TRT: "model.plan",
    Format.TF_SAVEDMODEL: "model.savedmodel",
    Format.TF_TRT: "model.savedmodel",
}  # SavedModels are folders
CACHE_ENV = "TBENCH_CACHE_DIR"
CONVERSION_JSON = "conversion.json"  # a step's own record next to its output (TensorRT: profile and calibration)


class ConversionOptions(BaseModel):
    """The guides' conversion knobs. The TensorRT builders' profile and calibration: tbench/request/trt_profiles.py."""

    onnx_opset: int = 17
    precision: Precision = Precision.FP32
    max_batch_size: int = 8  # TensorRT optimisation profile: batch 1 .. max
    max_workspace_bytes: int = 1 << 32
    opt_batch_size: int | None = None  # the profile's opt batch (trt_profiles.opt_batch_size of the run's grid)
    trt_shapes: dict[str, list[list[int]]] = {}  # non-batch MIN, OPT, MAX per input with dynamic dims
    calibration_samples: int | None = None  # INT8: samples calibrated on; trt_profiles.default_calibration_samples

    @classmethod
    def for_run(cls, req, precision: Precision | None = None, max_batch_size: int | None = None) -> ConversionOptions:
        """A resolved request's options: its precision and max batch unless given, the opt batch of its offline grid,
        its TensorRT shapes and calibration set size."""
        max_batch = max_batch_size or req.max_batch_size
        return cls(
            precision=precision or req.precision,
            max_batch_size=max_batch,
            opt_batch_size=opt_batch_size(req.batch_sizes, max_batch),
            trt_shapes=req.trt_shapes or {},
            calibration_samples=req.calibration_samples,
        )


# Fields only the steps that build TensorRT engines read: other steps' cache keys leave them out.
ENGINE_FIELDS = {"opt_batch_size", "trt_shapes", "calibration_samples"}


class ConversionUnavailable(ConversionError, Unavailable):
    """The tool a conversion needs is not on this machine (TensorRT needs a GPU node with TensorRT)."""


@dataclass(frozen=True)
class Converter:
    source: str  # a framework ("pytorch") or a Format value
    target: Format
    run: Callable  # (source, out_path, io_spec, options): source is the framework module or the previous file
    tools: tuple[str, ...]  # distributions whose versions make the cache key; the first must import
    where: str = ""  # where to run it when its tool is missing here
    precisions: tuple[Precision, ...] = (Precision.FP32,)  # what its output holds when options.precision asks for it
    builds_engine: bool = False  # a TensorRT builder: reads ENGINE_FIELDS and takes `data`, the calibration source


# (source, target) -> its converter; a converter is known by its function (a second one for a pair is refused)
REGISTRY: Registry[tuple[str, Format], Converter] = Registry("converter", describe=lambda c: qualified_name(c.run))


def converter(
    source: str,
    target: Format,
    tools: tuple[str, ...],
    where: str = "",
    precisions: tuple[Precision, ...] = (Precision.FP32,),
    builds_engine: bool = False,
):
    def register(fn):
        REGISTRY.register((source, target), Converter(source, target, fn, tools, where, precisions, builds_engine))
        return fn

    return register


@dataclass(frozen=True)
class CalibrationData:
    """The model's own batches for INT8 calibration: the user's --input-data (from its first sample, cycling) or
    --dataset when the run gives one, else the adapter's synthetic data, with a seed of their own."""

    adapter: ModelAdapter

    def __call__(self, n_samples: int, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        return (b.inputs for b in self.adapter.batches(n_samples, batch_size, seed=CALIBRATION_SEED))

    def describe(self) -> str:
        whole = getattr(self.adapter, "whole", self.adapter)  # an ensemble's part draws from the whole model's data
        if whole.given_samples is not None:
            return f"input data {whole.given_samples.path}"
        return f"dataset {whole.data_dir}" if whole.data_dir else f"synthetic data (seed {CALIBRATION_SEED})"


def engine_profile(spec: IoSpec, options: ConversionOptions, sample: dict) -> TrtProfile:
    """The optimisation profile a TensorRT builder uses: batch 1 / opt / max, dynamic dims from options.trt_shapes
    or pinned to the sample's size."""
    opt = options.opt_batch_size or opt_batch_size([], options.max_batch_size)
    return optimisation_profile(
        spec,
        {t.name: sample[t.name].shape[1:] for t in spec.inputs},
        options.max_batch_size,
        min(opt, options.max_batch_size),
        options.trt_shapes,
    )


class CalibrationSet:
    """options.calibration_samples (or the default) drawn from `data` as whole opt-shaped batches; counts the
    batches a builder actually took, for the conversion's record."""

    def __init__(self, spec: IoSpec, options: ConversionOptions, profile: TrtProfile, data: CalibrationData | None):
        if data is None:
            raise ConversionError("INT8 calibration needs the model's data; none was given to this conversion step")
        self.batch = profile.opt_batch
        self.requested = options.calibration_samples or default_calibration_samples(self.batch)
        check_calibration_samples(self.requested, self.batch)
        whole = self.requested // self.batch
        self.batches = calibration_batches(data(whole * self.batch, self.batch), spec, profile, self.requested)
        self.source, self.delivered = data.describe() if hasattr(data, "describe") else "given", 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for batch in self.batches:
            self.delivered += 1
            yield batch

    def record(self) -> dict:
        if not self.delivered:
            raise ConversionError(f"INT8 calibration got no batch of {self.batch} samples from {self.source}")
        return {
            "requested_samples": self.requested,
            "samples": self.delivered * self.batch,
            "batches": self.delivered,
            "batch_size": self.batch,
            "remainder_dropped": self.requested % self.batch,
            "source": self.source,
        }


def plan(source: str, target: Format) -> list[Converter]:
    """The shortest chain of registered converters from a framework (or format) to a target format."""
    queue, seen = deque([(source, [])]), {source}
    while queue:
        node, path = queue.popleft()
        for (src, tgt), conv in REGISTRY.items():
            if src == node and tgt.value not in seen:
                if tgt is target:
                    return path + [conv]
                seen.add(tgt.value)
                queue.append((tgt.value, path + [conv]))
    reachable = sorted({t.value for (s, t) in REGISTRY})
    raise ConversionError(f"no conversion from {source} to {target.value}; registered targets: {', '.join(reachable)}")


def _example(spec: IoSpec, sample: dict):
    import torch

    return tuple(torch.from_numpy(sample[t.name]) for t in spec.inputs)


@converter("pytorch", Format.ONNX, tools=("torch", "onnx"))
def pytorch_to_onnx(module, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    import torch

    dynamic = {
        t.name: {0: "batch", **{i + 1: f"{t.name}_{i + 1}" for i, d in enumerate(t.shape) if d == -1}}
        for t in spec.inputs + spec.outputs
    }
    torch.onnx.export(
        module,
        _example(spec, sample),
        str(out),
        input_names=spec.input_names(),
        output_names=spec.output_names(),
        dynamic_axes=dynamic,
        opset_version=options.onnx_opset,
        dynamo=False,
    )


_HALF = (Precision.FP32, Precision.FP16)


@converter("pytorch", Format.TS_TRACE, tools=("torch",), precisions=_HALF)
def pytorch_to_ts_trace(module, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    import torch

    if options.precision is Precision.FP16:  # traced in half precision, so the dtypes the trace bakes in are FP16 ones
        module = _half_boundary(copy.deepcopy(module).half(), spec)
    torch.jit.trace(module, _example(spec, sample), check_trace=False).save(str(out))


@converter("pytorch", Format.TS_SCRIPT, tools=("torch",), precisions=_HALF)
def pytorch_to_ts_script(module, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    import torch

    if options.precision is Precision.FP16:  # the model scripted in half; only the io casts around it are traced
        boundary = _half_boundary(torch.jit.script(copy.deepcopy(module).half()), spec)
        torch.jit.trace(boundary, _example(spec, sample), check_trace=False).save(str(out))
        return
    torch.jit.script(module).save(str(out))


def _half_boundary(half_module, spec: IoSpec):
    """`half_module` (FP16 weights) behind the io spec's dtypes: FP32 inputs cast to FP16 on the way in, outputs cast
    back to the spec's dtypes on the way out, so Triton's config, perf_analyzer and the clients keep FP32 io. Its
    forward takes the io spec's input names (Triton's libtorch backend and model files match inputs by them)."""
    import keyword

    import torch

    class HalfBoundary(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.cast_in = [t.dtype == "float32" for t in spec.inputs]
            self.out_dtypes = [getattr(torch, t.dtype) for t in spec.outputs]

        def forward(self, *inputs):
            return self.run(*inputs)

        def run(self, *inputs):
            out = self.inner(*(x.half() if cast else x for x, cast in zip(inputs, self.cast_in)))
            if isinstance(out, (tuple, list)):
                return tuple(o.to(d) for o, d in zip(out, self.out_dtypes))
            return out.to(self.out_dtypes[0])

    names = spec.input_names()
    if all(n.isidentifier() and not keyword.iskeyword(n) and n != "self" for n in names):
        scope: dict = {}  # forward(self, <names>): the traced module's argument names are the io spec's
        exec(f"def named(self, {', '.join(names)}):\n    return self.run({', '.join(names)})\n", {}, scope)
        HalfBoundary.forward = scope["named"]
    return HalfBoundary(half_module).eval()


@converter(Format.TS_TRACE.value, Format.TS_TRACE, tools=("torch",), precisions=_HALF)
def torchscript_trace_to_fp16(path: Path, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    _torchscript_to_fp16(path, out, spec, sample)


@converter(Format.TS_SCRIPT.value, Format.TS_SCRIPT, tools=("torch",), precisions=_HALF)
def torchscript_script_to_fp16(path: Path, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    _torchscript_to_fp16(path, out, spec, sample)


def _torchscript_to_fp16(path: Path, out: Path, spec: IoSpec, sample: dict) -> None:
    """A TorchScript file (another team's) in FP16: its module's weights in half, the io casts traced around it (its own
    code stays as it is; dtypes a traced file baked in as FP32 constants fail here or in the correctness check)."""
    import torch

    from tbench.core.model_file import TS_IO_SPEC

    extra = {TS_IO_SPEC: ""}
    module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra).eval().half()
    boundary = torch.jit.trace(_half_boundary(module, spec), _example(spec, sample), check_trace=False)
    torch.jit.save(boundary, str(out), _extra_files={k: v for k, v in extra.items() if v})


@converter(Format.ONNX.value, Format.ONNX, tools=("onnxruntime", "onnx"), precisions=_HALF)
def onnx_to_fp16(path: Path, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    """An FP32 ONNX file (ours or another team's) in FP16: ONNX Runtime's float16 converter (onnxconverter-common's,
    maintained inside onnxruntime), keeping the io FP32 with Cast nodes at the graph's edges; ops without FP16 support
    (its block list) stay FP32 behind casts."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
    onnx.save(model, str(out))


@converter(
    Format.ONNX.value, Format.TRT, tools=("tensorrt",), where=TRT_WHERE, precisions=tuple(Precision), builds_engine=True
)
def onnx_to_tensorrt(
    onnx_path: Path,
    out: Path,
    spec: IoSpec,
    options: ConversionOptions,
    sample: dict,
    data: CalibrationData | None = None,
) -> dict:
    """TensorRT's own builder: one optimisation profile (engine_profile) over batch 1..max_batch_size, FP16 when
    asked, INT8 calibrated on the calibration set at the profile's opt shapes. Returns the profile and calibration."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode from TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # from its path: external data is found next to it
        raise ConversionError(
            "TensorRT could not parse the ONNX model: "
            + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        )
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.max_workspace_bytes)
    if options.precision is Precision.FP16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = engine_profile(spec, options, sample)
    network_inputs = {network.get_input(i).name: network.get_input(i) for i in range(network.num_inputs)}
    trt_profile = builder.create_optimization_profile()
    for p in profile.inputs:
        if p.name in network_inputs:
            trt_profile.set_shape(p.name, p.min, p.opt, p.max)
    config.add_optimization_profile(trt_profile)
    calibration = None
    if options.precision is Precision.INT8:
        # implicit quantization: deprecated from TensorRT 10.1 in favour of explicit Q/DQ nodes, still built by 10.x
        config.set_flag(trt.BuilderFlag.INT8)
        config.set_flag(trt.BuilderFlag.FP16)  # layers INT8 cannot run fall back to FP16, not FP32
        config.set_calibration_profile(trt_profile)  # TensorRT calibrates at its opt shapes
        calibration = CalibrationSet(spec, options, profile, data)
        dtypes = {name: np.dtype(trt.nptype(t.dtype)) for name, t in network_inputs.items()}
        calibrator = _calibrator(trt, calibration, profile.opt_batch, dtypes, out.with_suffix(".calibration.cache"))
        config.int8_calibrator = calibrator
    engine = builder.build_serialized_network(network, config)
    if calibration is not None and calibrator.error is not None:
        raise ConversionError(f"INT8 calibration failed: {type(calibrator.error).__name__}: {calibrator.error}")
    if engine is None:
        raise ConversionError("TensorRT failed to build the engine (see the conversion log)")
    out.write_bytes(bytes(engine))
    return {"profile": profile.model_dump(), **({"calibration": calibration.record()} if calibration else {})}


def _calibrator(
    trt, batches: Iterable[dict[str, np.ndarray]], batch_size: int, dtypes: dict[str, np.dtype], cache: Path
):
    """INT8 entropy calibration, one batch of the calibration set at a time from GPU memory that torch holds
    (TensorRT reads device pointers). Never reads a calibration cache: the conversion cache keys the calibration set,
    a cache file left by another build would not; the one it writes stays next to the plan."""
    import torch

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self):
            super().__init__()
            self.batches, self.keep, self.error = iter(batches), {}, None

        def get_batch_size(self):
            return batch_size  # the profile's opt batch: every batch holds exactly that many samples

        def get_batch(self, names):
            try:
                batch = next(self.batches, None)
                if batch is None:
                    return None
                # cast to the network's input dtypes; the device buffers must outlive this call
                self.keep = {
                    n: torch.from_numpy(np.ascontiguousarray(batch[n], dtype=dtypes.get(n))).cuda() for n in names
                }
                return [int(self.keep[n].data_ptr()) for n in names]
            except Exception as err:  # TensorRT does not propagate a callback's exception: raised after the build
                self.error = err
                return None

        def read_calibration_cache(self):
            return None

        def write_calibration_cache(self, data):
            cache.write_bytes(bytes(data))

    return Calibrator()


def _tf_signature(spec: IoSpec):
    import tensorflow as tf

    return [
        tf.TensorSpec([None, *(None if d == -1 else d for d in t.shape)], tf.as_dtype(t.dtype), name=t.name)
        for t in spec.inputs
    ]


@converter("tensorflow", Format.TF_SAVEDMODEL, tools=("tensorflow", "keras"))
def keras_to_savedmodel(model, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    """A SavedModel whose serving_default signature uses the io spec's names, which Triton's TF backend reads."""
    import keras

    def serve(*args):
        result = model(list(args) if len(args) > 1 else args[0], training=False)
        results = result if isinstance(result, (list, tuple)) else [result]
        return {t.name: r for t, r in zip(spec.outputs, results)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name="serving_default", fn=serve, input_signature=_tf_signature(spec))
    archive.write_out(str(out), verbose=False)


@converter(Format.TF_SAVEDMODEL.value, Format.ONNX, tools=("tf2onnx", "tensorflow", "onnx"))
def savedmodel_to_onnx(saved: Path, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    """tf2onnx's own command line (as the guides run it); its output is kept next to the model."""
    argv = [
        sys.executable,
        "-m",
        "tf2onnx.convert",
        "--saved-model",
        str(saved),
        "--signature_def",
        "serving_default",
        "--opset",
        str(options.onnx_opset),
        "--output",
        str(out),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    (out.parent / "tf2onnx.log").write_text(" ".join(argv) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConversionError(f"tf2onnx failed (exit {done.returncode}): {tail[0]}")
    _rename_onnx_io(out, spec)


def _rename_onnx_io(path: Path, spec: IoSpec) -> None:
    """tf2onnx may suffix tensor names (`input:0`); Triton and perf_analyzer need the io spec's names."""
    import onnx

    model = onnx.load(str(path))
    wanted = set(spec.input_names() + spec.output_names())
    renames = {
        v.name: v.name.split(":")[0]
        for v in [*model.graph.input, *model.graph.output]
        if v.name != v.name.split(":")[0] and v.name.split(":")[0] in wanted
    }
    if not renames:
        return
    for v in [*model.graph.input, *model.graph.output]:
        v.name = renames.get(v.name, v.name)
    for node in model.graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    onnx.save(model, str(path))


@converter(
    Format.TF_SAVEDMODEL.value,
    Format.TF_TRT,
    tools=("tensorrt", "tensorflow"),
    where="run it on a GPU node whose TensorFlow is built with TensorRT (e.g. NGC's TensorFlow image)",
    precisions=tuple(Precision),
    builds_engine=True,
)
def savedmodel_to_tftrt(
    saved: Path, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict, data: CalibrationData | None = None
) -> dict:
    """TF-TRT's converter with dynamic shapes over the same profile as TensorRT's (engine_profile): engines built at
    its min, opt and max shapes plus one over the whole range (Range+Optimal), so any batch 1..max runs on TensorRT;
    INT8 calibrates on the same calibration set as onnx_to_tensorrt. Returns the profile and calibration."""
    import tensorflow as tf
    from tensorflow.python.compiler.tensorrt import trt_convert as trt

    modes = {
        Precision.FP32: trt.TrtPrecisionMode.FP32,
        Precision.FP16: trt.TrtPrecisionMode.FP16,
        Precision.INT8: trt.TrtPrecisionMode.INT8,
    }
    params = trt.TrtConversionParams(
        precision_mode=modes[options.precision],
        max_workspace_size_bytes=options.max_workspace_bytes,
        use_calibration=options.precision is Precision.INT8,
    )
    conv = trt.TrtGraphConverterV2(
        input_saved_model_dir=str(saved),
        conversion_params=params,
        use_dynamic_shape=True,
        dynamic_shape_profile_strategy="Range+Optimal",
    )
    profile = engine_profile(spec, options, sample)

    def tensors(arrays: dict[str, np.ndarray]) -> list:
        return [tf.constant(arrays[t.name]) for t in spec.inputs]  # the signature's inputs in the io spec's order

    calibration = CalibrationSet(spec, options, profile, data) if options.precision is Precision.INT8 else None
    conv.convert(calibration_input_fn=(lambda: (tensors(b) for b in calibration)) if calibration else None)
    shapes = [profile.shapes(which) for which in ("min", "opt", "max")]
    shapes = [s for i, s in enumerate(shapes) if s not in shapes[:i]]  # max_batch_size 1: one shape, built once
    conv.build(input_fn=lambda: (tensors(shaped_inputs(sample, spec, s)) for s in shapes))
    conv.save(str(out))
    return {"profile": profile.model_dump(), **({"calibration": calibration.record()} if calibration else {})}


def tool_versions(conv: Converter) -> dict[str, str]:
    try:
        importlib.import_module(conv.tools[0])
    except ImportError as err:
        hint = f"; {conv.where}" if conv.where else ""
        raise ConversionUnavailable(
            f"{conv.source} -> {conv.target.value} needs {conv.tools[0]}, which is not installed here ({err}){hint}"
        ) from None
    versions = {}
    for dist in conv.tools:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "unknown"
    return versions


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "tbench" / "conversions"))


def cache_key(
    source_hash: str, conv: Converter, options: ConversionOptions, versions: dict[str, str], spec: IoSpec
) -> str:
    """Same source, step, options, tool versions and io spec (static shapes are baked into some exports) -> same key.
    The profile and calibration fields key only TensorRT builders (the calibration set only an INT8 build's)."""
    unread = set() if conv.builds_engine else set(ENGINE_FIELDS)
    if options.precision is not Precision.INT8:
        unread.add("calibration_samples")
    text = json.dumps(
        {
            "source": source_hash,
            "step": [conv.source, conv.target.value],
            "options": options.model_dump(mode="json", exclude=unread),
            "tools": versions,
            "io": spec.model_dump(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _reproduce_script(
    adapter: ModelAdapter, conv: Converter, source_path: Path | None, out: Path, options: ConversionOptions
) -> str:
    source = "adapter.build()" if source_path is None else f"Path({str(source_path)!r})"
    return (
        f"# Re-runs this conversion step: {conv.source} -> {conv.target.value}\n"
        "from pathlib import Path\n\nimport model_adapters\nimport model_adapters.ensemble  # noqa: F401\n"
        "from model_adapters.file_model import ModelFileAdapter  # noqa: F401\n"
        "from tbench.stages.export import REGISTRY, CalibrationData, ConversionOptions  # noqa: F401\n"
        "from tbench.core.enums import Format\n\n"
        f"adapter = {adapter.reproduce_expr()}\n"
        f"options = ConversionOptions.model_validate_json({options.model_dump_json()!r})\n"
        f"step = REGISTRY[({conv.source!r}, Format({conv.target.value!r}))]\n"
        f"step.run({source}, Path({str(out)!r}), adapter.io_spec(), options, adapter.sample_batch(2)"
        + (", data=CalibrationData(adapter))\n" if conv.builds_engine else ")\n")
    )


def run_step(
    adapter: ModelAdapter,
    conv: Converter,
    source,
    source_hash: str,
    out_dir: Path,
    options: ConversionOptions,
    folder: str | None = None,
) -> tuple[Path, str, bool]:
    """One conversion into out_dir/<folder or target>/, from the cache when it has it; returns (path, content hash,
    cached). The key holds the options, the precision among them."""
    versions = tool_versions(conv)
    key = cache_key(source_hash, conv, options, versions, adapter.io_spec())
    target_dir = out_dir / (folder or conv.target.value)
    out = target_dir / FILE_NAMES[conv.target]
    cached = cache_root() / key
    if (cached / out.name).exists():
        shutil.rmtree(target_dir, ignore_errors=True)
        shutil.copytree(cached, target_dir)
        return out, key, True
    target_dir.mkdir(parents=True, exist_ok=True)
    source_path = source if isinstance(source, Path) else None
    (target_dir / "reproduce.py").write_text(_reproduce_script(adapter, conv, source_path, out, options))
    start = time.monotonic()
    record = None
    (target_dir / CONVERSION_JSON).unlink(missing_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            extra = {"data": CalibrationData(adapter)} if conv.builds_engine else {}
            record = conv.run(source, out, adapter.io_spec(), options, adapter.sample_batch(2), **extra)
        except BenchError:
            raise
        except Exception as err:  # exporters raise many types; one clear line is what users need
            raise ConversionError(
                f"{conv.source} -> {conv.target.value} failed for {adapter.name}: {type(err).__name__}: {err}"
            ) from err
        finally:
            log = [
                f"{conv.source} -> {conv.target.value} in {time.monotonic() - start:.2f} s",
                f"tools: {versions}",
                f"options: {options.model_dump_json()}",
                *_record_lines(record),
                *(f"warning: {w.category.__name__}: {w.message}" for w in caught),
            ]
            (target_dir / "convert.log").write_text("\n".join(log) + "\n")
    if record:  # what a report says of the build: the TensorRT profile and the INT8 calibration set
        (target_dir / CONVERSION_JSON).write_text(json.dumps(record, indent=2) + "\n")
    tmp = cache_root() / f".{key}.{os.getpid()}.tmp"  # copied whole, then renamed: a reader never sees half of it
    shutil.copytree(target_dir, tmp, dirs_exist_ok=True)
    try:
        tmp.rename(cached)
    except OSError:  # another run cached the same conversion meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return out, key, False


def _record_lines(record: dict | None) -> list[str]:
    """A builder's record as convert.log lines."""
    if not record:
        return []
    profile = record.get("profile")
    lines = [f"profile {line}" for line in describe(TrtProfile.model_validate(profile))] if profile else []
    c = record.get("calibration")
    if c:
        lines.append(
            f"calibration: {c['samples']} samples in {c['batches']} batches of {c['batch_size']} "
            f"(of {c['requested_samples']} asked; {c['remainder_dropped']} short of a batch dropped) "
            f"from {c['source']}"
        )
    return lines


def _copy_source_file(adapter: ModelAdapter, path: Path, fmt: Format, out_dir: Path) -> Path:
    """A user's model file served as it is: copied into the run, with the files an ONNX model keeps its weights in
    (external data, at the same relative places), so the run folder is complete."""
    from tbench.core.onnx_files import copy_onnx_external_files

    target = out_dir / fmt.value / FILE_NAMES[fmt]
    shutil.rmtree(target.parent, ignore_errors=True)
    target.parent.mkdir(parents=True)
    (shutil.copytree if path.is_dir() else shutil.copy2)(path, target)
    copy_onnx_external_files(path, target.parent)
    return target


def export_model(
    adapter: ModelAdapter,
    module,
    fmt: Format,
    out_dir: Path,
    source_hash: str,
    options: ConversionOptions | None = None,
) -> ModelArtifact:
    """The source model to `fmt` through the planned chain of conversions (none when the source is already `fmt`), in
    options.precision where `fmt` can hold it: the last step applies it, or the format's precision step converts the
    FP32 file. A format that cannot hold it (a SavedModel: FP16 is an accelerator there) stays FP32: the artifact's
    precision is always what its file holds (the request's check refuses what cannot be served)."""
    options = options or ConversionOptions()
    fp32 = options.model_copy(update={"precision": Precision.FP32})
    start = time.monotonic()
    if adapter.framework == fmt.value:
        source, digest, all_cached = _copy_source_file(adapter, Path(module), fmt, out_dir), source_hash, False
        held = file_precision(fmt, source)
    else:
        source, digest, all_cached, held = module, source_hash, True, Precision.FP32
        steps = plan(adapter.framework, fmt)
        with _no_grad(adapter.framework):
            for i, conv in enumerate(steps):
                applies = i == len(steps) - 1 and options.precision in conv.precisions
                source, digest, cached = run_step(adapter, conv, source, digest, out_dir, options if applies else fp32)
                all_cached, held = all_cached and cached, options.precision if applies else Precision.FP32
    own = (fmt.value, fmt)  # the format's own precision step: FP32 file -> reduced-precision file
    step = REGISTRY[own] if own in REGISTRY else None
    if held is Precision.FP32 and held is not options.precision and step and options.precision in step.precisions:
        with _no_grad(fmt.value):
            source, digest, cached = run_step(
                adapter, step, Path(source), digest, out_dir, options, folder=f"{fmt.value}-{options.precision.value}"
            )
        all_cached, held = all_cached and cached, options.precision
    return ModelArtifact(
        format=fmt,
        precision=held,
        path=str(source),
        io_spec=adapter.io_spec(),
        source_hash=source_hash,
        seconds=time.monotonic() - start,
        cached=all_cached,
    )


def file_precision(fmt: Format, path: Path) -> Precision:
    """The precision a model file holds, by the larger share of its floating-point weights: FP16 or FP32 (ONNX and
    TorchScript; other formats are taken as FP32)."""
    counts = {Precision.FP16: 0, Precision.FP32: 0}
    if fmt is Format.ONNX:
        import onnx

        kinds = {onnx.TensorProto.FLOAT16: Precision.FP16, onnx.TensorProto.FLOAT: Precision.FP32}
        for init in onnx.load(str(path), load_external_data=False).graph.initializer:
            if init.data_type in kinds:
                counts[kinds[init.data_type]] += int(np.prod(init.dims)) if len(init.dims) else 1
    elif fmt in (Format.TS_TRACE, Format.TS_SCRIPT):
        import torch

        module = torch.jit.load(str(path), map_location="cpu")
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.dtype in (torch.float16, torch.float32):
                counts[Precision.FP16 if tensor.dtype == torch.float16 else Precision.FP32] += tensor.numel()
    return Precision.FP16 if counts[Precision.FP16] > counts[Precision.FP32] else Precision.FP32


def _no_grad(framework: str):
    if framework in ("pytorch", Format.TS_TRACE.value, Format.TS_SCRIPT.value):
        import torch

        return torch.inference_mode()
    return contextlib.nullcontext()
