"""TensorRT plans run by TensorRT's own Python runtime (TensorRT 10's name-based tensor API), on device memory that
torch holds (torch is ours already; no pycuda), for the correctness stage. A batch above the engine's profile max is
run in chunks of at most that max and the outputs concatenated; a non-batch dim outside the profile is refused."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from tbench.core.errors import ConfigError, RuntimeUnavailable

TRT_WHERE = "run it on a GPU node with TensorRT (e.g. the NGC Triton image)"


def batch_chunks(n: int, max_batch: int) -> list[slice]:
    """Slices of at most max_batch samples covering 0..n in order (one empty slice for an empty batch)."""
    if max_batch < 1:
        raise ValueError(f"max batch must be >= 1, got {max_batch}")
    return [slice(start, min(start + max_batch, n)) for start in range(0, max(n, 1), max_batch)]


def run_chunked(
    run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], inputs: dict[str, np.ndarray], max_batch: int
) -> dict[str, np.ndarray]:
    """`run` on chunks of at most max_batch samples of every input, its outputs joined on the batch axis."""
    n = len(next(iter(inputs.values())))
    outs = [run({name: value[s] for name, value in inputs.items()}) for s in batch_chunks(n, max_batch)]
    return outs[0] if len(outs) == 1 else {name: np.concatenate([o[name] for o in outs]) for name in outs[0]}


def _dims(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


def check_in_profile(name: str, shape: Sequence[int], low: Sequence[int], high: Sequence[int]) -> None:
    """One line for an input shape the engine's profile does not cover."""
    if len(shape) != len(low) or any(not lo <= d <= hi for d, lo, hi in zip(shape, low, high)):
        raise ConfigError(
            f"input {name} of shape {_dims(shape)} is outside the TensorRT engine's profile "
            f"({_dims(low)} to {_dims(high)}); rebuild it with --trt-shape {name}:MIN,OPT,MAX "
            "covering it"
        )


def import_tensorrt():
    try:
        import tensorrt
    except ImportError as err:
        raise RuntimeUnavailable(
            f"running a TensorRT plan needs tensorrt, which is not installed here ({err}); {TRT_WHERE}"
        ) from None
    return tensorrt


def require_cuda():
    import torch

    if not torch.cuda.is_available():
        raise RuntimeUnavailable(
            f"running a TensorRT plan needs a CUDA GPU, and torch {torch.__version__} sees none here; {TRT_WHERE}"
        )
    return torch


class TrtEngine:
    """One deserialized plan with one execution context on its own CUDA stream; profile 0 is the one the converter
    builds."""

    def __init__(self, path: str | Path):
        trt = import_tensorrt()
        torch = require_cuda()
        self.torch = torch
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(Path(path).read_bytes())
        if self.engine is None:
            raise RuntimeError(
                f"TensorRT {trt.__version__} could not deserialize {path} (built by another TensorRT "
                "version or for another GPU?)"
            )
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        # (min, opt, max) per input; a static input's shape is all three
        self.ranges = {n: [list(s) for s in self.engine.get_tensor_profile_shape(n, 0)] for n in self.inputs}
        self.max_batch = min(r[2][0] for r in self.ranges.values()) if self.ranges else 1
        self.stream = torch.cuda.Stream()

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run_chunked(self._run_once, {n: inputs[n] for n in self.inputs}, self.max_batch)

    def _run_once(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        held, outs = [], {}  # device buffers must live until the stream has run
        with torch.cuda.stream(self.stream):
            for name in self.inputs:
                # in the engine's dtype (an engine may take int32 where the io spec says int64)
                value = np.ascontiguousarray(inputs[name], dtype=self.dtypes[name])
                value = value if value.flags.writeable else value.copy()  # torch warns on read-only arrays
                low, _, high = self.ranges[name]
                check_in_profile(name, value.shape, low, high)
                if not self.context.set_input_shape(name, value.shape):
                    raise RuntimeError(f"TensorRT refused shape {value.shape} for input {name}")
                device = torch.from_numpy(value).to("cuda")
                held.append(device)
                self.context.set_tensor_address(name, device.data_ptr())
            for name in self.outputs:
                shape = tuple(self.context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise RuntimeError(
                        f"output {name} has a data-dependent shape {shape}, which this runner does not allocate"
                    )
                device = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, self.dtypes[name])).dtype, device="cuda")
                outs[name] = device
                self.context.set_tensor_address(name, device.data_ptr())
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise RuntimeError("TensorRT failed to run the engine (see its log above)")
            self.stream.synchronize()
        return {name: device.cpu().numpy() for name, device in outs.items()}
