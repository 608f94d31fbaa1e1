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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from model_adapters.base import ModelAdapter
from tbench.artifacts import ModelArtifact
from tbench.enums import Format, Precision
from tbench.errors import ConversionError
from tbench.iospec import IoSpec
from tbench.runtimes import source_digest

FILE_NAMES = {Format.ONNX: "model.onnx", Format.TS_TRACE: "model.pt", Format.TS_SCRIPT: "model.pt", Format.TRT: "model.plan",
              Format.TF_SAVEDMODEL: "model.savedmodel", Format.TF_TRT: "model.savedmodel"}  # SavedModels are folders
CACHE_ENV = "TBENCH_CACHE_DIR"


class ConversionOptions(BaseModel):
    """The guides' conversion knobs."""

    onnx_opset: int = 17
    precision: Precision = Precision.FP32
    max_batch_size: int = 8  # TensorRT optimisation profile: batch 1 .. max
    max_workspace_bytes: int = 1 << 32


class ConversionUnavailable(ConversionError):
    """The tool a conversion needs is not on this machine (TensorRT needs a GPU node with TensorRT)."""


@dataclass(frozen=True)
class Converter:
    source: str  # a framework ("pytorch") or a Format value
    target: Format
    run: Callable  # (source, out_path, io_spec, options): source is the framework module or the previous file
    tools: tuple[str, ...]  # distributions whose versions make the cache key; the first must import
    where: str = ""  # where to run it when its tool is missing here
    precisions: tuple[Precision, ...] = (Precision.FP32,)  # what its output holds when options.precision asks for it


REGISTRY: dict[tuple[str, Format], Converter] = {}


def converter(source: str, target: Format, tools: tuple[str, ...], where: str = "",
              precisions: tuple[Precision, ...] = (Precision.FP32,)):
    def register(fn):
        REGISTRY[(source, target)] = Converter(source, target, fn, tools, where, precisions)
        return fn
    return register


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

    dynamic = {t.name: {0: "batch", **{i + 1: f"{t.name}_{i + 1}" for i, d in enumerate(t.shape) if d == -1}}
               for t in spec.inputs + spec.outputs}
    torch.onnx.export(module, _example(spec, sample), str(out), input_names=spec.input_names(),
                      output_names=spec.output_names(), dynamic_axes=dynamic, opset_version=options.onnx_opset, dynamo=False)


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

    from tbench.model_file import TS_IO_SPEC

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


@converter(Format.ONNX.value, Format.TRT, tools=("tensorrt",), where="run it on a GPU node with TensorRT (e.g. the NGC Triton image)",
           precisions=tuple(Precision))
def onnx_to_tensorrt(onnx_path: Path, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    """TensorRT's own builder: one optimisation profile over batch 1..max_batch_size, FP16 when asked."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode from TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(Path(onnx_path).read_bytes()):
        raise ConversionError("TensorRT could not parse the ONNX model: " +
                              "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.max_workspace_bytes)
    if options.precision is Precision.FP16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    for t in spec.inputs:
        dims = [max(d, 1) for d in sample[t.name].shape[1:]]  # dynamic non-batch dims: the sample's size
        profile.set_shape(t.name, [1, *dims], [max(1, options.max_batch_size // 2), *dims], [options.max_batch_size, *dims])
    config.add_optimization_profile(profile)
    if options.precision is Precision.INT8:
        config.set_flag(trt.BuilderFlag.INT8)
        config.set_flag(trt.BuilderFlag.FP16)  # layers INT8 cannot run fall back to FP16, not FP32
        config.set_calibration_profile(profile)
        config.int8_calibrator = _calibrator(trt, spec, sample, out.with_suffix(".calibration.cache"))
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise ConversionError("TensorRT failed to build the engine (see the conversion log)")
    out.write_bytes(bytes(engine))


def _calibrator(trt, spec: IoSpec, sample: dict, cache: Path):
    """INT8 entropy calibration on the sample batch, from GPU memory that torch holds (TensorRT reads device pointers)."""
    import torch

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self):
            super().__init__()
            self.batches = [{t.name: torch.from_numpy(sample[t.name]).cuda() for t in spec.inputs}]
            self.size = len(next(iter(sample.values())))

        def get_batch_size(self):
            return self.size

        def get_batch(self, names):
            if not self.batches:
                return None
            batch = self.batches.pop()
            self.keep = batch  # the device buffers must outlive this call
            return [int(batch[n].data_ptr()) for n in names]

        def read_calibration_cache(self):
            return cache.read_bytes() if cache.exists() else None

        def write_calibration_cache(self, data):
            cache.write_bytes(bytes(data))

    return Calibrator()


def _tf_signature(spec: IoSpec):
    import tensorflow as tf

    return [tf.TensorSpec([None, *(None if d == -1 else d for d in t.shape)], tf.as_dtype(t.dtype), name=t.name) for t in spec.inputs]


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
    argv = [sys.executable, "-m", "tf2onnx.convert", "--saved-model", str(saved), "--signature_def", "serving_default",
            "--opset", str(options.onnx_opset), "--output", str(out)]
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
    renames = {v.name: v.name.split(":")[0] for v in [*model.graph.input, *model.graph.output]
               if v.name != v.name.split(":")[0] and v.name.split(":")[0] in wanted}
    if not renames:
        return
    for v in [*model.graph.input, *model.graph.output]:
        v.name = renames.get(v.name, v.name)
    for node in model.graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    onnx.save(model, str(path))


@converter(Format.TF_SAVEDMODEL.value, Format.TF_TRT, tools=("tensorrt", "tensorflow"),
           where="run it on a GPU node whose TensorFlow is built with TensorRT (e.g. NGC's TensorFlow image)",
           precisions=tuple(Precision))
def savedmodel_to_tftrt(saved: Path, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    """TF-TRT's converter with dynamic shapes; engines built for batch 1, half and max; INT8 calibrates on the sample."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.compiler.tensorrt import trt_convert as trt

    modes = {Precision.FP32: trt.TrtPrecisionMode.FP32, Precision.FP16: trt.TrtPrecisionMode.FP16, Precision.INT8: trt.TrtPrecisionMode.INT8}
    params = trt.TrtConversionParams(precision_mode=modes[options.precision], max_workspace_size_bytes=options.max_workspace_bytes,
                                     use_calibration=options.precision is Precision.INT8)
    conv = trt.TrtGraphConverterV2(input_saved_model_dir=str(saved), conversion_params=params, use_dynamic_shape=True,
                                   dynamic_shape_profile_strategy="Optimal")

    def batches():
        for b in sorted({1, max(1, options.max_batch_size // 2), options.max_batch_size}):
            yield [tf.constant(np.resize(sample[t.name], (b, *sample[t.name].shape[1:]))) for t in spec.inputs]

    conv.convert(calibration_input_fn=batches if options.precision is Precision.INT8 else None)
    conv.build(input_fn=batches)
    conv.save(str(out))


def tool_versions(conv: Converter) -> dict[str, str]:
    try:
        importlib.import_module(conv.tools[0])
    except ImportError as err:
        hint = f"; {conv.where}" if conv.where else ""
        raise ConversionUnavailable(
            f"{conv.source} -> {conv.target.value} needs {conv.tools[0]}, which is not installed here ({err}){hint}") from None
    versions = {}
    for dist in conv.tools:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "unknown"
    return versions


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "tbench" / "conversions"))


def cache_key(source_hash: str, conv: Converter, options: ConversionOptions, versions: dict[str, str], spec: IoSpec) -> str:
    """Same source, step, options, tool versions and io spec (static shapes are baked into some exports) -> same key."""
    text = json.dumps({"source": source_hash, "step": [conv.source, conv.target.value], "options": options.model_dump(mode="json"),
                       "tools": versions, "io": spec.model_dump()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _reproduce_script(adapter: ModelAdapter, conv: Converter, source_path: Path | None, out: Path, options: ConversionOptions) -> str:
    source = "adapter.build()" if source_path is None else f"Path({str(source_path)!r})"
    return (f"# Re-runs this conversion step: {conv.source} -> {conv.target.value}\n"
            "from pathlib import Path\n\nimport model_adapters\nimport model_adapters.ensemble  # noqa: F401\nfrom model_adapters.file_model import ModelFileAdapter  # noqa: F401\nfrom tasks.export import REGISTRY, ConversionOptions\nfrom tbench.enums import Format\n\n"
            f"adapter = {adapter.reproduce_expr()}\n"
            f"options = ConversionOptions.model_validate_json({options.model_dump_json()!r})\n"
            f"step = REGISTRY[({conv.source!r}, Format({conv.target.value!r}))]\n"
            f"step.run({source}, Path({str(out)!r}), adapter.io_spec(), options, adapter.sample_batch(2))\n")


def run_step(adapter: ModelAdapter, conv: Converter, source, source_hash: str, out_dir: Path,
             options: ConversionOptions, folder: str | None = None) -> tuple[Path, str, bool]:
    """One conversion into out_dir/<folder or target>/, from the cache when it has it; returns (path, content hash, cached).
    The key holds the options, the precision among them."""
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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            conv.run(source, out, adapter.io_spec(), options, adapter.sample_batch(2))
        except ConversionError:
            raise
        except Exception as err:  # exporters raise many types; one clear line is what users need
            raise ConversionError(f"{conv.source} -> {conv.target.value} failed for {adapter.name}: {type(err).__name__}: {err}") from err
        finally:
            log = [f"{conv.source} -> {conv.target.value} in {time.monotonic() - start:.2f} s", f"tools: {versions}",
                   f"options: {options.model_dump_json()}", *(f"warning: {w.category.__name__}: {w.message}" for w in caught)]
            (target_dir / "convert.log").write_text("\n".join(log) + "\n")
    tmp = cache_root() / f".{key}.{os.getpid()}.tmp"  # copied whole, then renamed: a reader never sees half of it
    shutil.copytree(target_dir, tmp, dirs_exist_ok=True)
    try:
        tmp.rename(cached)
    except OSError:  # another run cached the same conversion meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return out, key, False


def _copy_source_file(adapter: ModelAdapter, path: Path, fmt: Format, out_dir: Path) -> Path:
    """A user's model file served as it is: copied into the run so the run folder is complete."""
    target = out_dir / fmt.value / FILE_NAMES[fmt]
    shutil.rmtree(target.parent, ignore_errors=True)
    target.parent.mkdir(parents=True)
    (shutil.copytree if path.is_dir() else shutil.copy2)(path, target)
    return target


def export_model(adapter: ModelAdapter, module, fmt: Format, out_dir: Path, source_hash: str,
                 options: ConversionOptions | None = None) -> ModelArtifact:
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
    step = REGISTRY.get((fmt.value, fmt))  # the format's own precision step: FP32 file -> reduced-precision file
    if held is Precision.FP32 and held is not options.precision and step and options.precision in step.precisions:
        with _no_grad(fmt.value):
            source, digest, cached = run_step(adapter, step, Path(source), digest, out_dir, options,
                                              folder=f"{fmt.value}-{options.precision.value}")
        all_cached, held = all_cached and cached, options.precision
    return ModelArtifact(format=fmt, precision=held, path=str(source), io_spec=adapter.io_spec(),
                         source_hash=source_hash, seconds=time.monotonic() - start, cached=all_cached)


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


@task(name="export", cache_policy=NO_CACHE)
def export_task(adapter: ModelAdapter, module, formats: list[Format], out_dir: Path,
                options: ConversionOptions | None = None) -> list[ModelArtifact]:
    digest = source_digest(adapter.framework, module)
    return [export_model(adapter, module, fmt, out_dir, digest, options) for fmt in formats]
