"""torch's exporters: PyTorch -> ONNX (torch.onnx: torch.export's exporter where it takes the model, the legacy
TorchScript-based one as the fallback, which exporter made the file recorded), PyTorch -> TorchScript traced or scripted
(torch.jit), in FP16 when asked, and TorchScript's own FP16 steps (an FP32 file, ours or another team's, -> FP16)."""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from pathlib import Path

from tbench.core.enums import Format, Precision
from tbench.core.errors import error_line
from tbench.core.iospec import IoSpec
from tbench.stages.converters.registry import HALF, ONNX_OPSET, ConversionOptions, converter


def _example(spec: IoSpec, sample: dict):
    import torch

    return tuple(torch.from_numpy(sample[t.name]) for t in spec.inputs)


DYNAMO = "dynamo"  # torch.export's exporter (torch.onnx.export(..., dynamo=True)), tried first
DYNAMO_OPSET = 18  # the opset torch.export's exporter writes (its torchlib's); a lower one asked is converted down
LEGACY = "legacy"  # the TorchScript-based exporter (dynamo=False), deprecated since torch 2.9: only the fallback


@converter("pytorch", Format.ONNX, tools=("torch", "onnx", "onnxscript"))
def pytorch_to_onnx(module, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> dict:
    """torch.export's exporter where it takes the model, the legacy one where it does not; returns the step's record,
    `exporter`: "dynamo" or "legacy (fallback: <why, in one line>)" (the artifact, artifacts.json and the manifest say
    it). Either way the file has the io spec's input and output names and a dynamic batch and dynamic dims where the
    spec has them, named as the legacy export named them ("batch", "<tensor>_<axis>"): Triton and perf_analyzer match
    by name."""
    try:
        _export_dynamo(module, out, spec, options, sample)
        written = _opset(out)
        if options.onnx_opset and written["onnx_opset"] != options.onnx_opset:  # an asked opset is the file's
            raise ValueError(
                f"opset {options.onnx_opset} asked: it writes {DYNAMO_OPSET} and could not convert this model down"
            )
        return {"exporter": DYNAMO, **written}
    except Exception as err:  # torch.export refuses many models its own way; the legacy exporter may still take them
        reason = fallback_reason(err)
    for leftover in (out, out.with_name(out.name + ".data")):
        leftover.unlink(missing_ok=True)
    _export_legacy(module, out, spec, options, sample)
    return {"exporter": f"{LEGACY} (fallback: {reason})", **_opset(out)}


def _dims(spec: IoSpec, tensors) -> list[dict[int, str]]:
    """Each tensor's dynamic axes by name: the batch (axis 0) and every -1 dim of the io spec."""
    return [{0: "batch", **{i + 1: f"{t.name}_{i + 1}" for i, d in enumerate(t.shape) if d == -1}} for t in tensors]


def _export_dynamo(module, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    """torch.onnx.export(dynamo=True): the dynamic axes as torch.export dims (named strings: any relation between
    them is allowed, a dim the model specialises to one value is an error), weights inside the one file, and the
    outputs' dynamic axes the spec names (an output the graph made static gets the spec's dynamic dim back)."""
    import onnx
    import torch

    dynamic_shapes = tuple(_dims(spec, spec.inputs))
    with warnings.catch_warnings(), _quiet_exporter_logs():
        # the renaming of axes that torch.export found equal (every input's batch) warns once per extra input
        warnings.filterwarnings("ignore", message=r"# The axis name: .* will not be used")
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")  # torch's own
        with torch.inference_mode(False), torch.no_grad():  # torch.export traces outside inference mode
            torch.onnx.export(
                module,
                _example(spec, sample),
                str(out),
                input_names=spec.input_names(),
                output_names=spec.output_names(),
                dynamic_shapes=dynamic_shapes,
                opset_version=options.onnx_opset or DYNAMO_OPSET,
                dynamo=True,
                external_data=False,
                verbose=False,
            )
    model = onnx.load(str(out))
    if _name_output_dims(model, spec):
        onnx.save(model, str(out))


# what the exporter logs on every export that the step's record says already (logger -> the start of the message):
# an asked opset below its own is built at 18 and converted down (a failed conversion is the record's fallback reason,
# its traceback not printed), and torchvision's ops are not registered where torchvision is not installed
QUIET = {
    "torch.onnx._internal.exporter._compat": "Setting ONNX exporter to use operator set version",
    "onnxscript.version_converter": "",
    "torch.onnx._internal.exporter._registration": "torchvision is not installed",
}


@contextlib.contextmanager
def _quiet_exporter_logs():
    filters = []
    for name, start in QUIET.items():

        def keep(record: logging.LogRecord, start: str = start) -> bool:
            return not str(record.msg).startswith(start)

        logging.getLogger(name).addFilter(keep)
        filters.append((name, keep))
    try:
        yield
    finally:
        for name, keep in filters:
            logging.getLogger(name).removeFilter(keep)


def _name_output_dims(model, spec: IoSpec) -> bool:
    """The spec's dynamic output axes that the exported graph left static or unnamed, named as the legacy exporter
    named them; True where anything changed. (Their names are labels: Triton and ONNX Runtime read -1 either way.)"""
    changed = False
    outputs = {o.name: o for o in model.graph.output}
    for t, axes in zip(spec.outputs, _dims(spec, spec.outputs)):
        value = outputs.get(t.name)
        if value is None or not value.type.HasField("tensor_type"):
            continue
        dims = value.type.tensor_type.shape.dim
        for axis, name in axes.items():
            if axis < len(dims) and not dims[axis].dim_param:
                dims[axis].dim_param = name  # clears dim_value (a oneof)
                changed = True
    return changed


def _opset(out: Path) -> dict:
    """The default domain's opset the file holds (the dynamo exporter writes 18+ and converts down where asked)."""
    import onnx

    model = onnx.load(str(out), load_external_data=False)
    return {"onnx_opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)}


def _export_legacy(module, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    import torch

    torch.onnx.export(
        module,
        _example(spec, sample),
        str(out),
        input_names=spec.input_names(),
        output_names=spec.output_names(),
        dynamic_axes=dict(zip(spec.input_names() + spec.output_names(), _dims(spec, spec.inputs + spec.outputs))),
        opset_version=options.onnx_opset or ONNX_OPSET,
        dynamo=False,
    )


def fallback_reason(err: BaseException) -> str:
    """Why torch.export's exporter did not take the model, in one line: the error torch.export itself raised (the
    exporter wraps it in a page of advice), with its type."""
    cause, seen = err, 0
    while cause.__cause__ is not None and seen < 5:
        cause, seen = cause.__cause__, seen + 1
    return f"{type(cause).__name__}: {error_line(cause, 200)}"


@converter("pytorch", Format.TS_TRACE, tools=("torch",), precisions=HALF)
def pytorch_to_ts_trace(module, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    import torch

    if options.precision is Precision.FP16:  # traced in half precision, so the dtypes the trace bakes in are FP16 ones
        module = _half_boundary(copy.deepcopy(module).half(), spec)
    torch.jit.trace(module, _example(spec, sample), check_trace=False).save(str(out))


@converter("pytorch", Format.TS_SCRIPT, tools=("torch",), precisions=HALF)
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


@converter(Format.TS_TRACE.value, Format.TS_TRACE, tools=("torch",), precisions=HALF)
def torchscript_trace_to_fp16(path: Path, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    _torchscript_to_fp16(path, out, spec, sample)


@converter(Format.TS_SCRIPT.value, Format.TS_SCRIPT, tools=("torch",), precisions=HALF)
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
