"""The framework's own ceiling (`tbench run --direct`): each exported model run directly by its runtime in this
process (ONNX Runtime, TorchScript, an AOTInductor package), on the device and with the threads it was served with,
at the offline points' batch sizes, one call after another. Its throughput is what Triton's offline figure is set
beside (Triton / direct per point).

The rows go to direct.csv, the manifest and the report, never to results.csv: they are no measured Triton point, and
the readers of results.csv (compare, history, search, the point cache) must not take them for one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tbench.core.enums import Format, Scenario
from tbench.core.metrics import OK, THROUGHPUT

DIRECT_CSV = "direct.csv"
DIRECT_FORMATS = (Format.ONNX, Format.TS_TRACE, Format.TS_SCRIPT, Format.PT2)
WARM_UP_CALLS = 10
MAX_CALLS = 300
MAX_SECONDS = 10.0  # per point: a large model's few hundred calls are capped by time, not count
MIN_CALLS = 5  # fewer than these after the time cap: the point is still taken, but from at least these


@dataclass(frozen=True)
class DirectRow:
    format: str
    batch_size: int
    device: str
    threads: int
    calls: int
    throughput_infer_per_s: float
    avg_ms: float
    p50_ms: float
    p99_ms: float
    triton_infer_per_s: float | None = None  # the run's best ok offline throughput at this format and batch size
    triton_over_direct: float | None = None


def torch_device(gpu_uuids: list[str], hardware_uuids: list[str]) -> str:
    """The device a model was served on, as this process names it: the served GPU's index in the node's list (the
    server saw it alone, through CUDA_VISIBLE_DEVICES; this process sees every GPU), else the CPU."""
    if not gpu_uuids:
        return "cpu"
    return f"cuda:{hardware_uuids.index(gpu_uuids[0]) if gpu_uuids[0] in hardware_uuids else 0}"


def direct_caller(fmt: Format, path: str, device: str, threads: int) -> Callable[[dict[str, np.ndarray]], Callable]:
    """A loader for one exported model: given inputs, it returns the call that runs the model once on them with the
    inputs already on `device` (what a zero-copy server would hand the runtime) and waits for the result."""
    if fmt is Format.ONNX:
        return _onnx_caller(path, device, threads)
    if fmt in (Format.TS_TRACE, Format.TS_SCRIPT, Format.PT2):
        return _torch_caller(fmt, path, device)
    raise ValueError(f"no in-process runtime here for {fmt.value}")


def _onnx_caller(path: str, device: str, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the python-backend runtime has it
    on_cuda = device.startswith("cuda")
    index = int(device.partition(":")[2] or 0) if on_cuda else 0
    providers = [("CUDAExecutionProvider", {"device_id": index})] if on_cuda else []
    session = ort.InferenceSession(path, sess_options=opts, providers=[*providers, "CPUExecutionProvider"])
    where = "cuda" if on_cuda else "cpu"

    def prepare(inputs: dict[str, np.ndarray]) -> Callable:
        binding = session.io_binding()
        for name, value in inputs.items():  # copied to the device once: the calls time the model, not the copies
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, where, index))
        for out in session.get_outputs():
            binding.bind_output(out.name, where, index)

        def call() -> None:
            session.run_with_iobinding(binding)
            if on_cuda:
                binding.synchronize_outputs()

        return call

    return prepare


def _torch_caller(fmt: Format, path: str, device: str):
    import torch

    if fmt is Format.PT2:
        import torch._inductor

        index = int(device.partition(":")[2] or 0) if device.startswith("cuda") else -1
        module = torch._inductor.aoti_load_package(path, device_index=index)
    else:
        module = torch.jit.load(path, map_location=device).eval()
    on_cuda = device.startswith("cuda")

    def prepare(inputs: dict[str, np.ndarray]) -> Callable:
        tensors = [torch.from_numpy(np.ascontiguousarray(v)).to(device) for v in inputs.values()]

        def call() -> None:
            with torch.inference_mode():
                module(*tensors)
            if on_cuda:
                torch.cuda.synchronize(device)

        return call

    return prepare


def time_calls(call: Callable[[], None], warm_up: int = WARM_UP_CALLS, calls: int = MAX_CALLS) -> list[float]:
    """Seconds per call, after `warm_up` untimed calls; stops early at MAX_SECONDS (with at least MIN_CALLS)."""
    for _ in range(warm_up):
        call()
    seconds: list[float] = []
    started = time.perf_counter()
    while len(seconds) < calls:
        before = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - before)
        if len(seconds) >= MIN_CALLS and time.perf_counter() - started > MAX_SECONDS:
            break
    return seconds


def direct_row(fmt: Format, batch_size: int, device: str, threads: int, seconds: list[float]) -> DirectRow:
    ms = np.asarray(seconds) * 1e3
    return DirectRow(
        format=fmt.value,
        batch_size=batch_size,
        device=device,
        threads=threads,
        calls=len(seconds),
        throughput_infer_per_s=batch_size * len(seconds) / float(np.sum(seconds)),
        avg_ms=float(np.mean(ms)),
        p50_ms=float(np.percentile(ms, 50)),
        p99_ms=float(np.percentile(ms, 99)),
    )


def measure_direct(
    fmt: Format,
    path: str,
    batch_sizes: Iterable[int],
    sample_batch: Callable[[int], dict[str, np.ndarray]],
    device: str,
    threads: int,
    calls: int = MAX_CALLS,
) -> list[DirectRow]:
    """One exported model's direct rows, one per batch size, with the threads the server's instance had."""
    with _torch_threads(threads):
        prepare = direct_caller(fmt, path, device, threads)
        return [
            direct_row(fmt, b, device, threads, time_calls(prepare(sample_batch(b)), calls=calls)) for b in batch_sizes
        ]


class _torch_threads:
    """torch's intra-op threads set for the block and restored after: this process goes on with its own."""

    def __init__(self, threads: int):
        self.threads = threads
        self.before = None

    def __enter__(self):
        try:
            import torch
        except ImportError:
            return self
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            import torch

            torch.set_num_threads(self.before)


def with_triton(rows: list[DirectRow], results: pd.DataFrame) -> list[DirectRow]:
    """Each direct row with the run's best ok offline throughput at its format and batch size, and their ratio
    (Triton / direct; empty where no such point was measured)."""
    best = _best_offline(results)
    out = []
    for row in rows:
        triton = best.get((row.format, row.batch_size))
        ratio = triton / row.throughput_infer_per_s if triton and row.throughput_infer_per_s > 0 else None
        out.append(DirectRow(**{**asdict(row), "triton_infer_per_s": triton, "triton_over_direct": ratio}))
    return out


def _best_offline(results: pd.DataFrame) -> dict[tuple[str, int], float]:
    if results.empty:
        return {}
    offline = results[(results["scenario"] == Scenario.OFFLINE.value) & (results["status"] == OK)]
    best = offline.groupby(["format", "batch_size"])[THROUGHPUT.column].max()
    return {(str(f), int(b)): float(v) for (f, b), v in best.items() if not math.isnan(float(v))}


def write_direct(run_dir: Path, rows: list[DirectRow]) -> Path:
    path = run_dir / DIRECT_CSV
    pd.DataFrame([asdict(r) for r in rows], columns=list(DirectRow.__dataclass_fields__)).to_csv(path, index=False)
    return path


def direct_summary(rows: list[DirectRow]) -> list[dict]:
    """The manifest's `direct`: the rows as they are."""
    return [asdict(r) for r in rows]


def unmeasured_formats(formats: Iterable[Format]) -> list[Format]:
    """The served formats this process has no runtime for (TensorRT engines, TF SavedModels): said in the report."""
    return [f for f in formats if f not in DIRECT_FORMATS and f is not Format.ENSEMBLE]
