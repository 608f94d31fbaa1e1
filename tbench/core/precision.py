"""What a precision means per serving format, what is refused, and what the results call what ran.

FP32: every format. FP16: ONNX (FP16 weights and compute, converted from the FP32 ONNX; the io stays FP32, Cast nodes
at the graph's edges), TorchScript (the module in half precision; the io stays FP32, cast at the boundary inside the
saved module), TensorRT and TF-TRT (their builders' FP16 mode). A TF SavedModel holds FP32 weights: its FP16 is a GPU
execution accelerator of Triton's TensorFlow backend, automatic mixed precision (the guides' "Automatic FP16", the
default) or TensorRT at precision_mode FP16, so it needs a GPU and a native TensorFlow backend. INT8: TensorRT and
TF-TRT only (calibrated on a calibration set: request/trt_profiles.py). Anything else is refused in one line before
anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tbench.core.enums import Format, Precision
from tbench.core.errors import ConfigError

# The precisions a format's file can hold (the artifact's `precision` is the one its file holds).
FILE_PRECISIONS: dict[Format, tuple[Precision, ...]] = {
    Format.ONNX: (Precision.FP32, Precision.FP16),
    Format.TS_TRACE: (Precision.FP32, Precision.FP16),
    Format.TS_SCRIPT: (Precision.FP32, Precision.FP16),
    Format.PT2: (Precision.FP32, Precision.FP16),
    Format.TRT: (Precision.FP32, Precision.FP16, Precision.INT8),
    Format.TF_TRT: (Precision.FP32, Precision.FP16, Precision.INT8),
    Format.TF_SAVEDMODEL: (Precision.FP32,),
}
# Formats whose engines are built for (and run on) a GPU.
GPU_BUILT = (Format.TRT, Format.TF_TRT)
# Triton GPU execution accelerators that run a SavedModel's FP32 weights in FP16; the first is what fp16 sets.
FP16_ACCELERATORS = ("auto_mixed_precision", "tensorrt")


def carriers(precision: Precision) -> str:
    return ", ".join(f.value for f, held in FILE_PRECISIONS.items() if precision in held)


def refusal(fmt: Format, precision: Precision, *, has_gpu: bool, server: str, accelerator: str | None) -> str | None:
    """Why `fmt` cannot be served in `precision` here, as one line; None when it can."""
    p = precision.value
    if precision is Precision.FP32:
        return None
    if fmt in GPU_BUILT:
        if not has_gpu and server in ("embedded", "local"):
            return f"precision {p} of {fmt.value} needs a GPU; this machine has none (use fp32)"
        return None
    if precision in FILE_PRECISIONS.get(fmt, ()):
        return None  # FP16 ONNX and TorchScript run on a CPU too (slowly)
    if fmt is Format.TF_SAVEDMODEL and precision is Precision.FP16:
        if accelerator not in FP16_ACCELERATORS:
            return (
                "precision fp16 of tf-savedmodel is a GPU accelerator over its FP32 weights "
                f"({' or '.join(FP16_ACCELERATORS)}); "
                f"{'none is applied here' if accelerator is None else f'accelerator {accelerator!r} is neither'} "
                f"(fp16 files: {carriers(precision)})"
            )
        if server == "embedded":
            return (
                "precision fp16 of tf-savedmodel is TensorFlow's automatic mixed precision on a GPU, "
                f"which the embedded server's python backend does not apply (fp16 files: {carriers(precision)})"
            )
        if not has_gpu:
            return (
                "precision fp16 of tf-savedmodel is TensorFlow's automatic mixed precision on a GPU; "
                "this machine has none "
                f"(fp16 files: {carriers(precision)})"
            )
        return None
    return f"precision {p} cannot be carried by {fmt.value}: {p} is carried by {carriers(precision)} only"


def check_precision(
    precision: Precision,
    serve: Iterable[Format],
    accelerators: dict[str, str],
    *,
    has_gpu: bool,
    server: str,
    parts: dict[str, list[str]] | None = None,
) -> dict[str, str]:
    """Refuse (ConfigError, one line) a served format that cannot run in `precision`; returns the accelerators, with
    automatic mixed precision for a served tf-savedmodel in fp16 that has none. An ensemble takes the precision part
    by part: parts whose format cannot carry it stay FP32 (the results name each part's precision), and it is refused
    only when no part can carry it."""
    accelerators = dict(accelerators)
    for fmt in serve:
        if fmt is Format.ENSEMBLE:
            continue
        if fmt is Format.TF_SAVEDMODEL and precision is Precision.FP16:
            accelerators.setdefault(fmt.value, FP16_ACCELERATORS[0])
        if reason := refusal(fmt, precision, has_gpu=has_gpu, server=server, accelerator=accelerators.get(fmt.value)):
            raise ConfigError(reason)
    if Format.ENSEMBLE in serve and parts and precision is not Precision.FP32:
        served = {name: Format.parse(formats[0]) for name, formats in parts.items()}
        if all(
            refusal(f, precision, has_gpu=has_gpu, server=server, accelerator=accelerators.get(f.value))
            for f in served.values()
        ):
            listed = ", ".join(f"{name} as {f.value}" for name, f in served.items())
            raise ConfigError(
                f"precision {precision.value} cannot be carried by any part of the ensemble ({listed}): "
                f"{precision.value} is carried by {carriers(precision)}"
            )
    return accelerators


def served_precision(held: Precision, accelerator: str, requested: Precision) -> str:
    """What a served artifact runs in, as the published tables label it: the precision its file holds, or, under
    Triton's TensorRT accelerator, the precision_mode its engines are built at (the request's). Automatic mixed
    precision keeps the file's FP32: the guides label it so (precision FP32, backend accelerator "Automatic FP16")."""
    return requested.value.upper() if accelerator.lower() == "tensorrt" else held.value.upper()


def results_precision(artifacts: list, requested: Precision, accelerator: Callable[[Format], str]) -> str:
    """The results' `precision` of one served model: its artifact's, or for an ensemble its parts' in order
    ("FP32 + FP16") when they differ. `accelerator(format)` is the accelerator the served config applies ("" if
    none)."""
    labels = [served_precision(a.precision, accelerator(a.format) or "", requested) for a in artifacts]
    return labels[0] if len(set(labels)) == 1 else " + ".join(labels)
