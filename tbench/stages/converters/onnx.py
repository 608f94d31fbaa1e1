"""ONNX's own precision step: an FP32 ONNX file (ours or another team's) -> FP16, with ONNX Runtime's converter."""

from __future__ import annotations

from pathlib import Path

from tbench.core.enums import Format
from tbench.core.iospec import IoSpec
from tbench.stages.converters.registry import HALF, ConversionOptions, converter


@converter(Format.ONNX.value, Format.ONNX, tools=("onnxruntime", "onnx"), precisions=HALF)
def onnx_to_fp16(path: Path, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    """An FP32 ONNX file (ours or another team's) in FP16: ONNX Runtime's float16 converter (onnxconverter-common's,
    maintained inside onnxruntime), keeping the io FP32 with Cast nodes at the graph's edges; ops without FP16 support
    (its block list) stay FP32 behind casts."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
    onnx.save(model, str(out))
