"""torch's exporters: PyTorch -> ONNX (torch.onnx), PyTorch -> TorchScript traced or scripted (torch.jit), in FP16
when asked, and TorchScript's own FP16 steps (an FP32 file, ours or another team's, -> FP16)."""

from __future__ import annotations

import copy
from pathlib import Path

from tbench.core.enums import Format, Precision
from tbench.core.iospec import IoSpec
from tbench.stages.converters.registry import HALF, ConversionOptions, converter


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
