"""Stage 5: the adapter's metric through Triton and through the framework, on the same samples."""

from __future__ import annotations

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from model_adapters.base import ModelAdapter
from tasks.correctness import run_framework
from tbench.artifacts import AccuracyResult
from tbench.errors import AccuracyError


def infer_triton(client, model_name: str, spec, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import tritonclient.grpc as grpcclient

    tensors = []
    for t in spec.inputs:
        value = np.ascontiguousarray(inputs[t.name])
        tensor = grpcclient.InferInput(t.name, list(value.shape), t.triton_dtype)
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    outputs = [grpcclient.InferRequestedOutput(n) for n in spec.output_names()]
    result = client.infer(model_name, tensors, outputs=outputs)
    return {n: result.as_numpy(n) for n in spec.output_names()}


def measure_accuracy(adapter: ModelAdapter, module, grpc_url: str, model_name: str, samples: int, batch_size: int) -> AccuracyResult:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    spec = adapter.io_spec()
    via_triton, via_framework, labels = [], [], []
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        for batch in adapter.batches(samples, batch_size, seed=2024):
            via_framework.append(adapter.predict(run_framework(module, spec, batch.inputs)))
            via_triton.append(adapter.predict(infer_triton(client, model_name, spec, batch.inputs)))
            labels.append(batch.labels)
    except InferenceServerException as err:
        raise AccuracyError(f"inference through Triton failed: {err.message()}") from err
    finally:
        client.close()
    fw, tr, lab = np.concatenate(via_framework), np.concatenate(via_triton), np.concatenate(labels)
    framework, triton = adapter.metric(fw, lab), adapter.metric(tr, lab)
    return AccuracyResult(metric=adapter.metric_name, samples=len(lab), framework=framework, triton=triton,
                          difference=triton - framework, agreement=float(np.mean(fw == tr)))


@task(name="accuracy", cache_policy=NO_CACHE)
def accuracy_task(adapter, module, grpc_url: str, model_name: str, samples: int, batch_size: int) -> AccuracyResult:
    return measure_accuracy(adapter, module, grpc_url, model_name, samples, batch_size)
