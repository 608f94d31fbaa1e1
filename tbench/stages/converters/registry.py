"""The converter registry and what every converter takes: a converter is a plain function
`run(source, out, io_spec, options, sample)` registered by (source, target) with the `converter` decorator; the
options are ConversionOptions. Importing this module imports tbench.stages.converters first, whose modules register
every converter, so REGISTRY is full whoever imports it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from tbench.core.enums import Format, Precision
from tbench.core.registry import Registry, qualified_name
from tbench.request.trt_profiles import opt_batch_size


class ConversionOptions(BaseModel):
    """The guides' conversion knobs. The TensorRT builders' profile and calibration: tbench/request/trt_profiles.py."""

    # None: each ONNX exporter's own (torch.export's 18; the legacy torch exporter's and tf2onnx's ONNX_OPSET); an asked
    # opset is the file's exactly
    onnx_opset: int | None = None
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

HALF = (Precision.FP32, Precision.FP16)  # the precisions of the converters that also write FP16
ONNX_OPSET = 17  # the opset of the exporters before torch.export's (tf2onnx, torch's legacy one) where none is asked


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
