"""TensorRT's builder (ONNX -> TensorRT plan) and what the TensorRT builders share, TF-TRT's (tensorflow.py) too: the
optimisation profile an engine is built over and the INT8 calibration set drawn from the model's data."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model_adapters.base import ModelAdapter
from tbench.core.enums import Format, Precision
from tbench.core.errors import ConversionError
from tbench.core.iospec import IoSpec
from tbench.core.trt_runtime import TRT_WHERE
from tbench.request.trt_profiles import (
    CALIBRATION_SEED,
    TrtProfile,
    calibration_batches,
    check_calibration_samples,
    default_calibration_samples,
    opt_batch_size,
    optimisation_profile,
)
from tbench.stages.converters.registry import ConversionOptions, converter


@dataclass(frozen=True)
class CalibrationData:
    """The model's own batches for INT8 calibration: the user's --input-data (from its first sample, cycling) or
    --dataset when the run gives one, else the adapter's synthetic data, with a seed of their own."""

    adapter: ModelAdapter

    def __call__(self, n_samples: int, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        return (b.inputs for b in self.adapter.batches(n_samples, batch_size, seed=CALIBRATION_SEED))

    def describe(self) -> str:
        whole = getattr(self.adapter, "whole", self.adapter)  # an ensemble's part draws from the whole model's data
        if whole.given_samples is not None:
            return f"input data {whole.given_samples.path}"
        return f"dataset {whole.data_dir}" if whole.data_dir else f"synthetic data (seed {CALIBRATION_SEED})"


def engine_profile(spec: IoSpec, options: ConversionOptions, sample: dict) -> TrtProfile:
    """The optimisation profile a TensorRT builder uses: batch 1 / opt / max, dynamic dims from options.trt_shapes
    or pinned to the sample's size."""
    opt = options.opt_batch_size or opt_batch_size([], options.max_batch_size)
    return optimisation_profile(
        spec,
        {t.name: sample[t.name].shape[1:] for t in spec.inputs},
        options.max_batch_size,
        min(opt, options.max_batch_size),
        options.trt_shapes,
    )


class CalibrationSet:
    """options.calibration_samples (or the default) drawn from `data` as whole opt-shaped batches; counts the
    batches a builder actually took, for the conversion's record."""

    def __init__(self, spec: IoSpec, options: ConversionOptions, profile: TrtProfile, data: CalibrationData | None):
        if data is None:
            raise ConversionError("INT8 calibration needs the model's data; none was given to this conversion step")
        self.batch = profile.opt_batch
        self.requested = options.calibration_samples or default_calibration_samples(self.batch)
        check_calibration_samples(self.requested, self.batch)
        whole = self.requested // self.batch
        self.batches = calibration_batches(data(whole * self.batch, self.batch), spec, profile, self.requested)
        self.source, self.delivered = data.describe() if hasattr(data, "describe") else "given", 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for batch in self.batches:
            self.delivered += 1
            yield batch

    def record(self) -> dict:
        if not self.delivered:
            raise ConversionError(f"INT8 calibration got no batch of {self.batch} samples from {self.source}")
        return {
            "requested_samples": self.requested,
            "samples": self.delivered * self.batch,
            "batches": self.delivered,
            "batch_size": self.batch,
            "remainder_dropped": self.requested % self.batch,
            "source": self.source,
        }


@converter(
    Format.ONNX.value, Format.TRT, tools=("tensorrt",), where=TRT_WHERE, precisions=tuple(Precision), builds_engine=True
)
def onnx_to_tensorrt(
    onnx_path: Path,
    out: Path,
    spec: IoSpec,
    options: ConversionOptions,
    sample: dict,
    data: CalibrationData | None = None,
) -> dict:
    """TensorRT's own builder: one optimisation profile (engine_profile) over batch 1..max_batch_size, FP16 when
    asked, INT8 calibrated on the calibration set at the profile's opt shapes. Returns the profile and calibration."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode from TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # from its path: external data is found next to it
        raise ConversionError(
            "TensorRT could not parse the ONNX model: "
            + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        )
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.max_workspace_bytes)
    if options.precision is Precision.FP16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = engine_profile(spec, options, sample)
    network_inputs = {network.get_input(i).name: network.get_input(i) for i in range(network.num_inputs)}
    trt_profile = builder.create_optimization_profile()
    for p in profile.inputs:
        if p.name in network_inputs:
            trt_profile.set_shape(p.name, p.min, p.opt, p.max)
    config.add_optimization_profile(trt_profile)
    calibration = None
    if options.precision is Precision.INT8:
        # implicit quantization: deprecated from TensorRT 10.1 in favour of explicit Q/DQ nodes, still built by 10.x
        config.set_flag(trt.BuilderFlag.INT8)
        config.set_flag(trt.BuilderFlag.FP16)  # layers INT8 cannot run fall back to FP16, not FP32
        config.set_calibration_profile(trt_profile)  # TensorRT calibrates at its opt shapes
        calibration = CalibrationSet(spec, options, profile, data)
        dtypes = {name: np.dtype(trt.nptype(t.dtype)) for name, t in network_inputs.items()}
        calibrator = _calibrator(trt, calibration, profile.opt_batch, dtypes, out.with_suffix(".calibration.cache"))
        config.int8_calibrator = calibrator
    engine = builder.build_serialized_network(network, config)
    if calibration is not None and calibrator.error is not None:
        raise ConversionError(f"INT8 calibration failed: {type(calibrator.error).__name__}: {calibrator.error}")
    if engine is None:
        raise ConversionError("TensorRT failed to build the engine (see the conversion log)")
    out.write_bytes(bytes(engine))
    return {"profile": profile.model_dump(), **({"calibration": calibration.record()} if calibration else {})}


def _calibrator(
    trt, batches: Iterable[dict[str, np.ndarray]], batch_size: int, dtypes: dict[str, np.dtype], cache: Path
):
    """INT8 entropy calibration, one batch of the calibration set at a time from GPU memory that torch holds
    (TensorRT reads device pointers). Never reads a calibration cache: the conversion cache keys the calibration set,
    a cache file left by another build would not; the one it writes stays next to the plan."""
    import torch

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self):
            super().__init__()
            self.batches, self.keep, self.error = iter(batches), {}, None

        def get_batch_size(self):
            return batch_size  # the profile's opt batch: every batch holds exactly that many samples

        def get_batch(self, names):
            try:
                batch = next(self.batches, None)
                if batch is None:
                    return None
                # cast to the network's input dtypes; the device buffers must outlive this call
                self.keep = {
                    n: torch.from_numpy(np.ascontiguousarray(batch[n], dtype=dtypes.get(n))).cuda() for n in names
                }
                return [int(self.keep[n].data_ptr()) for n in names]
            except Exception as err:  # TensorRT does not propagate a callback's exception: raised after the build
                self.error = err
                return None

        def read_calibration_cache(self):
            return None

        def write_calibration_cache(self, data):
            cache.write_bytes(bytes(data))

    return Calibrator()
