"""Stage 1: export and convert. Converters are plain functions registered by (source, target); a chain such as
PyTorch -> ONNX -> TensorRT is planned over the registry, not hard-coded. Each step leaves its log and a reproduce
script next to its output and is cached by content: same source, same options, same tool versions -> no rerun."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from model_adapters.base import ModelAdapter
from tbench.artifacts import ModelArtifact
from tbench.enums import Format, Precision
from tbench.errors import ConversionError
from tbench.iospec import IoSpec

FILE_NAMES = {Format.ONNX: "model.onnx", Format.TS_TRACE: "model.pt", Format.TS_SCRIPT: "model.pt", Format.TRT: "model.plan"}
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


REGISTRY: dict[tuple[str, Format], Converter] = {}


def converter(source: str, target: Format, tools: tuple[str, ...], where: str = ""):
    def register(fn):
        REGISTRY[(source, target)] = Converter(source, target, fn, tools, where)
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


@converter("pytorch", Format.TS_TRACE, tools=("torch",))
def pytorch_to_ts_trace(module, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    import torch

    torch.jit.trace(module, _example(spec, sample), check_trace=False).save(str(out))


@converter("pytorch", Format.TS_SCRIPT, tools=("torch",))
def pytorch_to_ts_script(module, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    import torch

    torch.jit.script(module).save(str(out))


@converter(Format.ONNX.value, Format.TRT, tools=("tensorrt",), where="run it on a GPU node with TensorRT (e.g. the NGC Triton image)")
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
    elif options.precision is Precision.INT8:
        raise ConversionError("INT8 TensorRT engines need a calibration dataset, which this conversion does not take yet")
    profile = builder.create_optimization_profile()
    for t in spec.inputs:
        dims = [max(d, 1) for d in sample[t.name].shape[1:]]  # dynamic non-batch dims: the sample's size
        profile.set_shape(t.name, [1, *dims], [max(1, options.max_batch_size // 2), *dims], [options.max_batch_size, *dims])
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise ConversionError("TensorRT failed to build the engine (see the conversion log)")
    out.write_bytes(bytes(engine))


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


def cache_key(source_hash: str, conv: Converter, options: ConversionOptions, versions: dict[str, str]) -> str:
    text = json.dumps({"source": source_hash, "step": [conv.source, conv.target.value], "options": options.model_dump(mode="json"),
                       "tools": versions}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def state_hash(module) -> str:
    """Content hash of the weights, so artifacts say exactly what they came from."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _reproduce_script(adapter: ModelAdapter, conv: Converter, source_path: Path | None, out: Path, options: ConversionOptions) -> str:
    source = "adapter.build()" if source_path is None else f"Path({str(source_path)!r})"
    return (f"# Re-runs this conversion step: {conv.source} -> {conv.target.value}\n"
            "from pathlib import Path\n\nimport model_adapters\nfrom tasks.export import REGISTRY, ConversionOptions\nfrom tbench.enums import Format\n\n"
            f"adapter = model_adapters.get({adapter.name!r}, {adapter.size!r}, {adapter.checkpoint!r})\n"
            f"options = ConversionOptions.model_validate_json({options.model_dump_json()!r})\n"
            f"step = REGISTRY[({conv.source!r}, Format({conv.target.value!r}))]\n"
            f"step.run({source}, Path({str(out)!r}), adapter.io_spec(), options, adapter.sample_batch(2))\n")


def run_step(adapter: ModelAdapter, conv: Converter, source, source_hash: str, out_dir: Path,
             options: ConversionOptions) -> tuple[Path, str, bool]:
    """One conversion into out_dir/<target>/, from the cache when it has it; returns (path, content hash, cached)."""
    versions = tool_versions(conv)
    key = cache_key(source_hash, conv, options, versions)
    target_dir = out_dir / conv.target.value
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


def export_model(adapter: ModelAdapter, module, fmt: Format, out_dir: Path, source_hash: str,
                 options: ConversionOptions | None = None) -> ModelArtifact:
    """The framework model to `fmt` through the planned chain of conversions."""
    import torch

    options = options or ConversionOptions()
    start = time.monotonic()
    source, digest, all_cached = module, source_hash, True
    with torch.inference_mode():
        for conv in plan(adapter.framework, fmt):
            source, digest, cached = run_step(adapter, conv, source, digest, out_dir, options)
            all_cached = all_cached and cached
    return ModelArtifact(format=fmt, precision=options.precision, path=str(source), io_spec=adapter.io_spec(),
                         source_hash=source_hash, seconds=time.monotonic() - start, cached=all_cached)


@task(name="export", cache_policy=NO_CACHE)
def export_task(adapter: ModelAdapter, module, formats: list[Format], out_dir: Path) -> list[ModelArtifact]:
    digest = state_hash(module)
    return [export_model(adapter, module, fmt, out_dir, digest) for fmt in formats]
