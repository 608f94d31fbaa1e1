"""Stage 2: every exported model against the framework model on the same sample batch."""

from __future__ import annotations

import numpy as np

from model_adapters.base import ModelAdapter
from tbench.core.artifacts import CorrectnessResult, ModelArtifact, OutputError
from tbench.core.errors import BenchError, CorrectnessError, error_line
from tbench.core.runtimes import run_file, run_source


def compare(
    reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], atol: float, rtol: float
) -> list[OutputError]:
    """Pass when max|a - b| <= atol + rtol * max|ref| for each output; a string output when every string is equal
    (its error: the share of strings that differ)."""
    rows = []
    for name, ref in reference.items():
        got = candidate[name]
        if got.shape != ref.shape:
            raise CorrectnessError(f"output {name}: shape {got.shape} differs from the framework's {ref.shape}")
        if ref.dtype.kind == "O" or got.dtype.kind == "O":
            differ = float(np.mean(_text(got) != _text(ref))) if ref.size else 0.0
            rows.append(
                OutputError(output=name, max_abs_err=differ, max_rel_err=differ, tolerance=0.0, passed=not differ)
            )
            continue
        abs_err = float(np.max(np.abs(got.astype(np.float64) - ref))) if ref.size else 0.0
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        tolerance = atol + rtol * scale
        rows.append(
            OutputError(
                output=name,
                max_abs_err=abs_err,
                max_rel_err=abs_err / scale if scale else abs_err,
                tolerance=tolerance,
                passed=bool(abs_err <= tolerance),
            )
        )
    return rows


def _text(values: np.ndarray) -> np.ndarray:
    """Strings as str, whether a runtime gave them as str or (Triton) as UTF-8 bytes."""
    return np.vectorize(lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v), otypes=[object])(values)


def check_artifacts(
    adapter: ModelAdapter, module, artifacts: list[ModelArtifact], atol: float, rtol: float, batch_size: int = 4
) -> list[CorrectnessResult]:
    spec = adapter.io_spec()
    inputs = adapter.sample_batch(batch_size, seed=7)
    try:
        reference = run_source(adapter.framework, module, spec, inputs)
    except BenchError:
        raise
    except Exception as err:  # the runtime rejects the inputs (an index out of an embedding table's range, a shape)
        raise CorrectnessError(
            adapter.rejected_inputs(f"{adapter.name} ({adapter.framework})", error_line(err), inputs)
        ) from err
    return [
        CorrectnessResult(
            format=a.format, batch_size=batch_size, outputs=compare(reference, _run_export(a, inputs), atol, rtol)
        )
        for a in artifacts
    ]


def _run_export(artifact: ModelArtifact, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    try:
        return run_file(artifact.format, artifact.path, artifact.io_spec, inputs)
    except BenchError:
        raise
    except Exception as err:
        raise CorrectnessError(
            f"the exported {artifact.format.value} model failed on inputs its source ran: {error_line(err)}"
        ) from err


def require_passed(results: list[CorrectnessResult]) -> None:
    for r in results:
        for o in r.outputs:
            if not o.passed:
                raise CorrectnessError(
                    f"{r.format.value}{f' ({r.model})' if r.model else ''} output {o.output} "
                    "differs from the framework model: "
                    f"max abs error {o.max_abs_err:.3g} > tolerance {o.tolerance:.3g}"
                )
