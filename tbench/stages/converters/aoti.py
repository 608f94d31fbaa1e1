"""torch.export + AOTInductor: PyTorch -> pt2, an AOTInductor package (`model.pt2`) that Triton's PyTorch backend serves
natively (`platform: "torch_aoti"`, Triton 26.03 on) and the python-backend runtime model loads elsewhere.

The module is exported with torch.export (non-strict) at the sample batch, its batch axis dynamic from 1 to the run's
max batch (never below the correctness stage's batch) and each dynamic dim of the io spec left to torch.export
(Dim.AUTO); the program is compiled by AOTInductor with the machine's C++ compiler and packaged into the output path.
The package's metadata carries the io spec, the precision, the batch range and the torch that made it
(tbench.core.pt2_files reads them back for `--model-file x.pt2`). In FP16 the module is exported in half behind the
same FP32 io casts as TorchScript's FP16.

Where torch.export cannot take the model (a branch on a tensor's value, an op without a meta kernel, a batch the model
fixes), the conversion fails with one line naming the construct and where in the model's code it is."""

from __future__ import annotations

import copy
import os
import re
import traceback
from pathlib import Path

import numpy as np

from tbench.core.enums import Format, Precision
from tbench.core.errors import ConversionError, one_line
from tbench.core.iospec import IoSpec
from tbench.core.pt2_files import IO_SPEC_KEY, MAX_BATCH_KEY, PRECISION_KEY, TORCH_KEY
from tbench.stages.converters.registry import HALF, ConversionOptions, converter

CHECKED_BATCH = 4  # tbench.stages.correctness runs this batch whatever the run's max batch
ALTERNATIVES = "serve it as ts-trace or onnx instead"


@converter("pytorch", Format.PT2, tools=("torch",), precisions=HALF)
def pytorch_to_pt2(module, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    import torch

    name = type(module).__name__
    with torch.inference_mode(False):  # the export stage runs its steps in inference mode: trace with normal tensors
        if options.precision is Precision.FP16:
            from tbench.stages.converters.pytorch import _half_boundary

            module = _half_boundary(copy.deepcopy(module).half(), spec)
        args = tuple(torch.from_numpy(np.array(sample[t.name])) for t in spec.inputs)
        max_batch = max(options.max_batch_size, CHECKED_BATCH, *(len(a) for a in args))
        program = export_program(module, args, spec, max_batch, name)
        metadata = {
            IO_SPEC_KEY: spec.model_dump_json(),
            PRECISION_KEY: options.precision.value,
            MAX_BATCH_KEY: str(max_batch),
            TORCH_KEY: torch.__version__,
        }
        compile_package(program, out, metadata, name)


def export_program(module, args: tuple, spec: IoSpec, max_batch: int, name: str = "the model"):
    """torch.export of `module` at `args`, axis 0 of every input one dynamic batch dim (1..max_batch)."""
    import torch
    from torch.export import Dim

    batch = Dim("batch", min=1, max=max_batch)
    dynamic = tuple({0: batch, **{i + 1: Dim.AUTO for i, d in enumerate(t.shape) if d == -1}} for t in spec.inputs)
    try:
        return torch.export.export(module, args, dynamic_shapes=dynamic, strict=False)
    except Exception as err:
        raise ConversionError(f"torch.export cannot take {name}: {refusal(err)}; {ALTERNATIVES}") from None


def compile_package(program, out: Path, metadata: dict[str, str], name: str = "the model") -> None:
    from torch._inductor import aoti_compile_and_package

    try:
        aoti_compile_and_package(
            program, package_path=str(out), inductor_configs={"aot_inductor.metadata": dict(metadata)}
        )
    except Exception as err:
        hint = "; AOTInductor needs a C++ compiler (g++) on PATH" if "compiler" in str(err).lower() else ""
        raise ConversionError(
            f"AOTInductor could not compile {name}'s exported program: {type(err).__name__}: "
            f"{one_line(_first_line(err), 240)}{hint}; {ALTERNATIVES}"
        ) from None


# ---------------------------------------------------------------- why torch.export refused


_DATA_DEPENDENT = re.compile(r"data-dependent expression (.+?)(?: \(unhinted| \(|$)")


def refusal(err: BaseException) -> str:
    """torch.export's refusal as one clause: what it could not take, and where in the model's code."""
    kind = type(err).__name__
    text = str(err)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    match = _DATA_DEPENDENT.search(text)
    if match or "GuardOnDataDependentSymNode" in kind or "DataDependent" in kind:
        what = "a data-dependent expression" + (f" ({match.group(1).strip()})" if match else "")
        what += " (Python control flow or a shape that depends on a tensor's values; torch.cond takes such a branch)"
    elif "ConstraintViolation" in kind or lines and lines[0].startswith("Constraints violated"):
        detail = next((line[2:] for line in lines if line.startswith("- ")), lines[0] if lines else kind)
        what = f"a dynamic dim the model fixes: {one_line(detail.split('. ')[0], 200)}"
    else:
        what = f"{kind}: {one_line(_first_line(err), 200)}"
    where = model_frame(err)
    return what + (f" at {where}" if where else "")


def model_frame(err: BaseException) -> str:
    """The innermost frame of the model's own code in the traceback (torch's and this converter's left out):
    'file.py:LINE `code`', or '' when there is none."""
    import torch

    skipped = tuple(os.path.dirname(os.path.abspath(p)) + os.sep for p in (torch.__file__, __file__))
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if not os.path.abspath(f.filename).startswith(skipped) and not f.filename.startswith("<")
    ]
    if not frames:
        return ""
    frame = frames[-1]
    code = f" `{one_line(frame.line, 120)}`" if frame.line else ""
    return f"{os.path.basename(frame.filename)}:{frame.lineno}{code}"


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
