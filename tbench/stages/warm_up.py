"""The warm-up before anything is timed: every batch size a sweep sends and the dynamic batcher can form, and each
batch size's calibrated single-request latency."""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from tbench.core import progress
from tbench.core.iospec import IoSpec


def _zeros(shape: list[int], dtype: np.dtype) -> np.ndarray:
    """A warm-up input: zeros, or empty strings for a string input."""
    return np.full(shape, "", dtype=object) if dtype.kind == "O" else np.zeros(shape, dtype)


FORMED_WARMUP_S = 30.0  # warming every batch the batcher can form stops here (largest models, largest batches)
FORMED_WARMUP_CALLS = 2  # TorchScript's profiling executor: the first call profiles, the second optimises


def formed_batch_sizes(request_batch: int, max_batch_size: int, concurrency: int | None = None) -> list[int]:
    """The batches a dynamic batcher can hand the model when each request carries `request_batch` samples: every
    multiple of it up to max_batch_size, and at most `concurrency` requests' worth under a closed loop (None: open
    loop). Empty where the model has no batch axis (max_batch_size 0)."""
    if max_batch_size < 1 or request_batch < 1:
        return []
    largest = max_batch_size if concurrency is None else min(max_batch_size, concurrency * request_batch)
    return list(range(request_batch, largest + 1, request_batch))


def warm_up(
    grpc_url: str,
    model: str,
    spec: IoSpec,
    batch_sizes: list[int],
    requests: int,
    shapes: dict[str, list[int]] | None = None,
    calibrate_s: float = 0.25,
    max_timed: int = 10,
    batching: bool = True,
    model_version: str = "",
    formed: Iterable[int] = (),
) -> dict[int, float]:
    """Warm up and calibrate: `requests` untimed requests at every batch size of the sweep (runtimes allocate and
    optimise per input shape on their first calls, which would otherwise land in the first windows), then timed ones
    (until `calibrate_s` or `max_timed`) whose median is the batch size's single-request latency, in seconds.
    `formed`: the batches the dynamic batcher can hand the model (formed_batch_sizes), each warmed untimed too, within
    FORMED_WARMUP_S. TorchScript compiles a graph for every new batch size on its first calls (7 ms instead of 1.3 on
    this CPU, 6-22 ms instead of 1.1 on an H200): unwarmed, those land in the first rate point's p99.
    Returns {batch_size: latency_s}; empty where the model cannot answer zeros (its points will say why)."""
    import tritonclient.grpc as grpcclient

    from tbench.stages.accuracy import infer_triton

    def zeros(batch: int) -> dict[str, np.ndarray]:
        return {
            t.name: _zeros(
                [batch] * batching + ((shapes or {}).get(t.name) or [max(d, 1) for d in t.shape]), t.np_dtype
            )
            for t in spec.inputs
        }

    latencies: dict[int, float] = {}
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        for batch in batch_sizes:
            inputs = zeros(batch)
            for _ in range(requests):
                infer_triton(client, model, spec, inputs, model_version)
            timed: list[float] = []
            while len(timed) < max_timed and sum(timed) < calibrate_s:
                start = time.perf_counter()
                infer_triton(client, model, spec, inputs, model_version)
                timed.append(time.perf_counter() - start)
            latencies[batch] = float(np.median(timed))
        others = [b for b in sorted(set(formed)) if b not in latencies]
        deadline = time.monotonic() + FORMED_WARMUP_S
        for i, batch in enumerate(others):
            if time.monotonic() > deadline:
                progress.emit("warmup_partial", model=model, warmed=others[:i], left=others[i:])
                break
            inputs = zeros(batch)
            for _ in range(max(requests, FORMED_WARMUP_CALLS)):
                infer_triton(client, model, spec, inputs, model_version)
    except Exception as err:  # a model that cannot answer zeros still gets measured; its point will say why
        progress.emit("warmup_failed", model=model, error=str(err))
    finally:
        client.close()
    return latencies
