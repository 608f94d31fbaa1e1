"""Stage 5: each served format through Triton against the source model on the same samples: the served outputs
must match the source's (within tolerance), and the adapter's metric is computed both ways where there are labels."""

from __future__ import annotations

import numpy as np

from model_adapters.base import ModelAdapter
from tbench.core.artifacts import AccuracyResult, OutputError
from tbench.core.enums import Format
from tbench.core.errors import AccuracyError
from tbench.core.runtimes import run_source
from tbench.stages.correctness import compare
from tbench.triton.server import INFER_TIMEOUT_S


def infer_triton(
    client, model_name: str, spec, inputs: dict[str, np.ndarray], model_version: str = ""
) -> dict[str, np.ndarray]:
    import tritonclient.grpc as grpcclient

    tensors = []
    for t in spec.inputs:
        value = np.ascontiguousarray(inputs[t.name])
        value = value if t.shape else value.reshape(*value.shape, 1)  # served as [1] (config.served_dims)
        tensor = grpcclient.InferInput(t.name, list(value.shape), t.triton_dtype)
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    outputs = [grpcclient.InferRequestedOutput(n) for n in spec.output_names()]
    result = client.infer(
        model_name, tensors, outputs=outputs, model_version=model_version, client_timeout=INFER_TIMEOUT_S
    )
    served = {}
    for t in spec.outputs:
        value = result.as_numpy(t.name)
        served[t.name] = value if t.shape else value.reshape(value.shape[:-1])  # back from [1] to no dims
    return served


def _worst(rows: list[list[OutputError]]) -> list[OutputError]:
    """Per output, the batch with the largest error relative to its tolerance."""
    by_output: dict[str, OutputError] = {}
    for batch in rows:
        for o in batch:
            kept = by_output.get(o.output)
            if kept is None or o.max_abs_err / max(o.tolerance, 1e-30) > kept.max_abs_err / max(kept.tolerance, 1e-30):
                by_output[o.output] = o
    return list(by_output.values())


def measure_accuracy(
    adapter: ModelAdapter,
    module,
    grpc_url: str,
    model_name: str,
    samples: int,
    batch_size: int,
    atol: float = 1e-3,
    rtol: float = 1e-3,
    fmt: Format | None = None,
) -> AccuracyResult:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    spec = adapter.io_spec()
    errors, via_triton, via_framework, labels = [], [], [], []
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        for batch in adapter.batches(samples, batch_size, seed=2024):
            reference = run_source(adapter.framework, module, spec, batch.inputs)
            served = infer_triton(client, model_name, spec, batch.inputs)
            errors.append(compare(reference, served, atol, rtol))
            if batch.labels is not None:
                via_framework.append(adapter.predict(reference))
                via_triton.append(adapter.predict(served))
                labels.append(batch.labels)
    except InferenceServerException as err:
        raise AccuracyError(f"inference through Triton failed for {model_name}: {err.message()}") from err
    finally:
        client.close()
    result = AccuracyResult(format=fmt, samples=samples, outputs=_worst(errors))
    if labels:
        fw, tr, lab = np.concatenate(via_framework), np.concatenate(via_triton), np.concatenate(labels)
        framework, triton = adapter.metric(fw, lab), adapter.metric(tr, lab)
        # class predictions agree when equal; scores (a click probability) when equal within the tolerance
        same = fw == tr if fw.dtype.kind in "iub" else np.isclose(tr, fw, rtol=rtol, atol=atol)
        result = result.model_copy(
            update=dict(
                metric=adapter.metric_name,
                samples=len(lab),
                framework=framework,
                triton=triton,
                difference=triton - framework,
                agreement=float(np.mean(same)),
            )
        )
    return result


def require_same_answers(result: AccuracyResult, model_name: str) -> None:
    for o in result.outputs:
        if not o.passed:
            raise AccuracyError(
                f"{model_name} answers differently through Triton: output {o.output} max abs error "
                f"{o.max_abs_err:.3g} > tolerance {o.tolerance:.3g}"
            )
