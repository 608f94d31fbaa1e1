"""Stage 1: export and convert. Converters are plain functions registered by (source, target), in
tbench/stages/converters/; a chain such as PyTorch -> ONNX -> TensorRT is planned over the registry, not hard-coded.
Each step leaves its log and a reproduce script next to its output and is cached by content: same source, same
options, same tool versions -> no rerun.

Precision (what each format can hold: tbench/core/precision.py): the step that makes the target applies the requested
precision where it can (TensorRT's builders, TF-TRT, the TorchScript exporters); otherwise a precision step registered
as (format, format) converts the FP32 file (FP32 ONNX -> FP16 ONNX, also for other teams' files) into
`<format>-<precision>/`. Steps before the last run at FP32. The artifact's precision is what its file holds."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import time
import warnings
from collections import deque
from pathlib import Path

import numpy as np

from model_adapters.base import ModelAdapter
from tbench.core import disk_cache
from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Format, Precision
from tbench.core.errors import BenchError, ConversionError, StorageError, Unavailable
from tbench.core.iospec import IoSpec
from tbench.request.trt_profiles import TrtProfile, describe

# The converters register themselves when tbench.stages.converters is imported (its __init__ imports every converter
# module), which importing its registry does first: REGISTRY is full before plan() or run_step() reads it.
from tbench.stages.converters.registry import ENGINE_FIELDS, REGISTRY, ConversionOptions, Converter
from tbench.stages.converters.tensorrt import CalibrationData

FILE_NAMES = {
    Format.ONNX: "model.onnx",
    Format.TS_TRACE: "model.pt",
    Format.TS_SCRIPT: "model.pt",
    Format.PT2: "model.pt2",
    Format.TRT: "model.plan",
    Format.TF_SAVEDMODEL: "model.savedmodel",
    Format.TF_TRT: "model.savedmodel",
}  # SavedModels are folders
CACHE_ENV = "TBENCH_CACHE_DIR"
CONVERSION_JSON = "conversion.json"  # a step's own record next to its output (TensorRT: profile and calibration)


class ConversionUnavailable(ConversionError, Unavailable):
    """The tool a conversion needs is not on this machine (TensorRT needs a GPU node with TensorRT)."""


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
        "from tbench.stages.converters.registry import REGISTRY, ConversionOptions\n"
        "from tbench.stages.converters.tensorrt import CalibrationData  # noqa: F401\n"
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
        disk_cache.used(cached)
        shutil.rmtree(target_dir, ignore_errors=True)
        copy_tree(cached, target_dir)
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
    copy_tree(target_dir, tmp, dirs_exist_ok=True)
    try:
        tmp.rename(cached)
    except OSError:  # another run cached the same conversion meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    disk_cache.trim(cache_root(), keep=cached)
    return out, key, False


def copy_tree(source: Path, target: Path, **options) -> None:
    """shutil.copytree, its failure in one line (shutil.Error lists every file that failed: a full disk fails them
    all), naming the fix."""
    try:
        shutil.copytree(source, target, **options)
    except shutil.Error as err:
        failed = err.args[0] if err.args and isinstance(err.args[0], list) else []
        why = failed[0][2] if failed and len(failed[0]) == 3 else str(err)
        raise StorageError(
            f"cannot copy {source} to {target} ({len(failed) or 'some'} files failed): {why}: free some space there, "
            "or write elsewhere (--output, TBENCH_STAGING_DIR, TBENCH_CACHE_DIR)"
        ) from None


def _record_lines(record: dict | None) -> list[str]:
    """A builder's record as convert.log lines."""
    if not record:
        return []
    profile = record.get("profile")
    lines = [f"exporter: {record['exporter']}"] if record.get("exporter") else []  # PyTorch -> ONNX: which one
    lines += [f"profile {line}" for line in describe(TrtProfile.model_validate(profile))] if profile else []
    c = record.get("calibration")
    if c:
        lines.append(
            f"calibration: {c['samples']} samples in {c['batches']} batches of {c['batch_size']} "
            f"(of {c['requested_samples']} asked; {c['remainder_dropped']} short of a batch dropped) "
            f"from {c['source']}"
        )
    return lines


def step_exporter(out: Path) -> str | None:
    """The exporter a step's record names (PyTorch -> ONNX: "dynamo", or "legacy (fallback: why)"), from the
    conversion.json beside its output: a cached step's too. None for steps that name none."""
    try:
        return json.loads((out.parent / CONVERSION_JSON).read_text()).get("exporter")
    except (OSError, ValueError, AttributeError):
        return None


def _copy_source_file(adapter: ModelAdapter, path: Path, fmt: Format, out_dir: Path) -> Path:
    """A user's model file served as it is: copied into the run, with the files an ONNX model keeps its weights in
    (external data, at the same relative places), so the run folder is complete."""
    from tbench.core.onnx_files import copy_onnx_external_files

    target = out_dir / fmt.value / FILE_NAMES[fmt]
    shutil.rmtree(target.parent, ignore_errors=True)
    target.parent.mkdir(parents=True)
    (copy_tree if path.is_dir() else shutil.copy2)(path, target)
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
    exporter = None  # the PyTorch -> ONNX step's exporter, for every artifact made from its file
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
                exporter = step_exporter(Path(source)) or exporter
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
        exporter=exporter,
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
    elif fmt is Format.PT2:  # a package tbench made says so in its metadata; another one is taken as FP32
        from tbench.core.pt2_files import package_precision

        return Precision.parse(package_precision(path))
    return Precision.FP16 if counts[Precision.FP16] > counts[Precision.FP32] else Precision.FP32


def _no_grad(framework: str):
    if framework in ("pytorch", Format.TS_TRACE.value, Format.TS_SCRIPT.value):
        import torch

        return torch.inference_mode()
    return contextlib.nullcontext()
